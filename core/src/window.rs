//! Maintenance windows (`upgradePolicy.maintenanceWindows`): whether a new
//! cycle may start at an instant, and when the next window opens. Pure: the
//! instant is an argument (tests inject it), the time zones come from the
//! bundled tz database (the same in every image, whatever the host has).

use jiff::civil::{Date, Weekday as CivilWeekday};
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};
use ttdrv_api::{MaintenanceWindow, Weekday};

/// A window read and checked: local minutes of the day, the days it opens
/// on (all when empty), its time zone.
#[derive(Clone, Debug)]
pub struct Window {
    days: Vec<CivilWeekday>,
    /// Minutes after local midnight.
    start: u16,
    /// Minutes after local midnight, 1..=1440; below `start`: the next day.
    end: u16,
    tz: TimeZone,
    /// `Mon,Fri 22:00-04:00 Europe/Berlin`, for messages.
    text: String,
}

fn civil(d: Weekday) -> CivilWeekday {
    match d {
        Weekday::Mon => CivilWeekday::Monday,
        Weekday::Tue => CivilWeekday::Tuesday,
        Weekday::Wed => CivilWeekday::Wednesday,
        Weekday::Thu => CivilWeekday::Thursday,
        Weekday::Fri => CivilWeekday::Friday,
        Weekday::Sat => CivilWeekday::Saturday,
        Weekday::Sun => CivilWeekday::Sunday,
    }
}

/// `HH:MM` as minutes after midnight (`24:00` is 1440).
fn minutes(hhmm: &str) -> Option<u16> {
    let (h, m) = hhmm.split_once(':')?;
    let (h, m): (u16, u16) = (h.parse().ok()?, m.parse().ok()?);
    (m < 60 && (h < 24 || (h == 24 && m == 0))).then_some(h * 60 + m)
}

/// Reads `windows`; the first one that cannot be used is named
/// (`upgradePolicy.maintenanceWindows[i]...`) with why.
pub fn parse(windows: &[MaintenanceWindow]) -> Result<Vec<Window>, String> {
    windows
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let field = |f: &str| format!("upgradePolicy.maintenanceWindows[{i}].{f}");
            let start = minutes(&w.start)
                .filter(|m| *m < 1440)
                .ok_or_else(|| format!("{}: {:?} is not HH:MM", field("start"), w.start))?;
            let end = minutes(&w.end)
                .ok_or_else(|| format!("{}: {:?} is not HH:MM or 24:00", field("end"), w.end))?;
            if start == end {
                return Err(format!(
                    "{}: equals start {:?}: a window needs a length",
                    field("end"),
                    w.start
                ));
            }
            let tz = TimeZone::get(&w.time_zone).map_err(|_| {
                format!(
                    "{}: {:?} is not a time zone of the IANA database (e.g. UTC, Europe/Berlin, America/Los_Angeles)",
                    field("timeZone"),
                    w.time_zone
                )
            })?;
            let days: Vec<CivilWeekday> = w.days.iter().copied().map(civil).collect();
            let day_text = if w.days.is_empty() {
                "daily".to_string()
            } else {
                w.days
                    .iter()
                    .map(|d| format!("{d:?}"))
                    .collect::<Vec<_>>()
                    .join(",")
            };
            Ok(Window {
                days,
                start,
                end,
                tz,
                text: format!("{day_text} {}-{} {}", w.start, w.end, w.time_zone),
            })
        })
        .collect()
}

impl Window {
    fn opens_on(&self, d: CivilWeekday) -> bool {
        self.days.is_empty() || self.days.contains(&d)
    }

    fn is_open(&self, now: Timestamp) -> bool {
        let local = now.to_zoned(self.tz.clone());
        let m = (i32::from(local.hour()) * 60 + i32::from(local.minute())) as u16;
        let day = local.weekday();
        if self.start < self.end {
            self.opens_on(day) && self.start <= m && m < self.end
        } else {
            // Past midnight: the evening of an opening day, or the morning after one.
            (self.opens_on(day) && m >= self.start)
                || (self.opens_on(day.previous()) && m < self.end)
        }
    }

    /// The first opening strictly after `now` (within the next eight days).
    fn next_open(&self, now: Timestamp) -> Option<Timestamp> {
        let today: Date = now.to_zoned(self.tz.clone()).date();
        (0..=8i64)
            .filter_map(|k| today.checked_add(k.days()).ok())
            .filter(|d| self.opens_on(d.weekday()))
            .filter_map(|d| {
                let at = d.at((self.start / 60) as i8, (self.start % 60) as i8, 0, 0);
                // A start in a DST gap opens at the gap's end.
                at.to_zoned(self.tz.clone()).ok().map(|z| z.timestamp())
            })
            .find(|t| *t > now)
    }
}

/// Whether a new cycle may start at `now`, and if not, why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Gate {
    Open,
    Closed {
        /// When the next window opens (None: never, which parse prevents).
        next_open: Option<Timestamp>,
        why: String,
    },
}

/// The gate at `now` over `windows` (open when there are none).
pub fn gate(windows: &[Window], now: Timestamp) -> Gate {
    if windows.is_empty() || windows.iter().any(|w| w.is_open(now)) {
        return Gate::Open;
    }
    let next_open = windows.iter().filter_map(|w| w.next_open(now)).min();
    let list = windows
        .iter()
        .map(|w| w.text.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    let why = match next_open {
        Some(t) => format!(
            "outside the maintenance windows ({list}): no new cycle starts until the next opens at {t}"
        ),
        None => format!("outside the maintenance windows ({list})"),
    };
    Gate::Closed { next_open, why }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(days: &[Weekday], start: &str, end: &str, tz: &str) -> MaintenanceWindow {
        MaintenanceWindow {
            days: days.to_vec(),
            start: start.into(),
            end: end.into(),
            time_zone: tz.into(),
        }
    }

    fn at(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    fn open(windows: &[MaintenanceWindow], now: &str) -> bool {
        gate(&parse(windows).expect("valid"), at(now)) == Gate::Open
    }

    #[test]
    fn no_window_is_always_open() {
        assert!(open(&[], "2026-12-05T03:00:00Z"));
    }

    #[test]
    fn a_daytime_window_on_weekdays() {
        // 2026-12-07 is a Monday.
        let ws = [w(&[Weekday::Mon, Weekday::Tue], "09:00", "17:00", "UTC")];
        assert!(open(&ws, "2026-12-07T09:00:00Z"));
        assert!(open(&ws, "2026-12-07T16:59:59Z"));
        assert!(!open(&ws, "2026-12-07T17:00:00Z"), "the end is exclusive");
        assert!(!open(&ws, "2026-12-07T08:59:59Z"));
        assert!(!open(&ws, "2026-12-09T10:00:00Z"), "a Wednesday");
        let Gate::Closed { next_open, why } =
            gate(&parse(&ws).expect("valid"), at("2026-12-09T10:00:00Z"))
        else {
            panic!("closed")
        };
        assert_eq!(next_open, Some(at("2026-12-14T09:00:00Z")), "next Monday");
        assert!(why.contains("Mon,Tue 09:00-17:00 UTC"), "{why}");
        assert!(why.contains("2026-12-14T09:00:00Z"), "{why}");
    }

    #[test]
    fn a_window_past_midnight_belongs_to_the_day_it_opens() {
        // Friday 22:00 to Saturday 04:00 in Berlin (UTC+1 in December).
        let ws = [w(&[Weekday::Fri], "22:00", "04:00", "Europe/Berlin")];
        assert!(open(&ws, "2026-12-11T21:30:00Z"), "Fri 22:30 local");
        assert!(open(&ws, "2026-12-12T02:59:00Z"), "Sat 03:59 local");
        assert!(!open(&ws, "2026-12-12T03:00:00Z"), "Sat 04:00 local");
        assert!(
            !open(&ws, "2026-12-12T21:30:00Z"),
            "Sat 22:30: not an opening day"
        );
        assert!(
            !open(&ws, "2026-12-11T02:00:00Z"),
            "Fri 03:00: Thursday did not open"
        );
        let Gate::Closed { next_open, .. } =
            gate(&parse(&ws).expect("valid"), at("2026-12-12T03:00:00Z"))
        else {
            panic!("closed")
        };
        assert_eq!(next_open, Some(at("2026-12-18T21:00:00Z")));
    }

    #[test]
    fn every_day_when_no_day_is_named_and_24_00_ends_the_day() {
        let ws = [w(&[], "20:00", "24:00", "America/Los_Angeles")];
        assert!(open(&ws, "2026-12-08T07:59:00Z"), "23:59 local");
        assert!(!open(&ws, "2026-12-08T08:00:00Z"), "00:00 local");
        assert!(!open(&ws, "2026-12-08T03:59:00Z"), "19:59 local");
    }

    #[test]
    fn any_open_window_opens_the_gate_and_the_earliest_next_is_named() {
        let ws = [
            w(&[Weekday::Sat], "10:00", "12:00", "UTC"),
            w(&[Weekday::Thu], "10:00", "12:00", "Asia/Tokyo"),
        ];
        assert!(open(&ws, "2026-12-12T11:00:00Z"));
        assert!(open(&ws, "2026-12-10T01:30:00Z"), "Thu 10:30 in Tokyo");
        let Gate::Closed { next_open, .. } =
            gate(&parse(&ws).expect("valid"), at("2026-12-07T00:00:00Z"))
        else {
            panic!("closed")
        };
        assert_eq!(next_open, Some(at("2026-12-10T01:00:00Z")));
    }

    #[test]
    fn a_start_in_a_dst_gap_opens_when_the_clock_resumes() {
        // 2027-03-28 02:30 does not exist in Berlin (clocks go 02:00 -> 03:00).
        let ws = [w(&[Weekday::Sun], "02:30", "05:00", "Europe/Berlin")];
        let Gate::Closed { next_open, .. } =
            gate(&parse(&ws).expect("valid"), at("2027-03-27T12:00:00Z"))
        else {
            panic!("closed")
        };
        let t = next_open.expect("opens");
        assert!(
            t >= at("2027-03-28T01:00:00Z") && t <= at("2027-03-28T01:30:00Z"),
            "{t}"
        );
    }

    #[test]
    fn bad_windows_are_named() {
        let e = parse(&[
            w(&[], "09:00", "17:00", "UTC"),
            w(&[], "09:00", "17:00", "Mars/Olympus"),
        ])
        .expect_err("unknown zone");
        assert!(
            e.starts_with("upgradePolicy.maintenanceWindows[1].timeZone:")
                && e.contains("Mars/Olympus"),
            "{e}"
        );
        let e = parse(&[w(&[], "25:00", "17:00", "UTC")]).expect_err("bad start");
        assert!(e.contains("[0].start"), "{e}");
        let e = parse(&[w(&[], "00:00", "24:00", "UTC")]);
        assert!(e.is_ok(), "a whole day is a window: {e:?}");
        let e = parse(&[w(&[], "09:00", "09:00", "UTC")]).expect_err("no length");
        assert!(e.contains("[0].end"), "{e}");
    }
}
