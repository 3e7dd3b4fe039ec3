//! A small parser of the Prometheus text exposition format (0.0.4), for the unit
//! tests only: they check what a scrape of [`super::Metrics`] would show, by
//! series name and labels, instead of comparing raw text line by line. Nothing
//! outside the tests uses it, so it is compiled only under `cfg(test)`.

use std::collections::{BTreeMap, HashMap};

/// One sample of the text exposition.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Sample {
    pub(super) name: String,
    pub(super) labels: BTreeMap<String, String>,
    pub(super) value: f64,
}

/// A strict enough parser of the text format (0.0.4) for these tests:
/// `name{l="v",...} value`, with `\\`, `\"` and `\n` escapes in values.
pub(super) fn parse(text: &str) -> (Vec<Sample>, HashMap<String, String>) {
    let mut samples = Vec::new();
    let mut types = HashMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (n, t) = rest.split_once(' ').expect("TYPE line has a type");
            types.insert(n.to_string(), t.to_string());
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let chars: Vec<char> = line.chars().collect();
        let mut i = 0;
        let mut name = String::new();
        while i < chars.len() && chars[i] != '{' && chars[i] != ' ' {
            name.push(chars[i]);
            i += 1;
        }
        let mut labels = BTreeMap::new();
        if chars.get(i) == Some(&'{') {
            i += 1;
            loop {
                if chars.get(i) == Some(&'}') {
                    i += 1;
                    break;
                }
                let mut lname = String::new();
                while chars[i] != '=' {
                    lname.push(chars[i]);
                    i += 1;
                }
                i += 1;
                assert_eq!(chars[i], '"', "in {line}");
                i += 1;
                let mut val = String::new();
                loop {
                    match chars[i] {
                        '\\' => {
                            i += 1;
                            val.push(if chars[i] == 'n' { '\n' } else { chars[i] });
                        }
                        '"' => {
                            i += 1;
                            break;
                        }
                        c => val.push(c),
                    }
                    i += 1;
                }
                labels.insert(lname, val);
                if chars.get(i) == Some(&',') {
                    i += 1;
                }
            }
        }
        let rest: String = chars[i..].iter().collect();
        let value: f64 = match rest.trim() {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("bad value in {line}")),
        };
        samples.push(Sample {
            name,
            labels,
            value,
        });
    }
    (samples, types)
}

pub(super) fn select<'a>(
    samples: &'a [Sample],
    name: &str,
    labels: &[(&str, &str)],
) -> Vec<&'a Sample> {
    samples
        .iter()
        .filter(|s| s.name == name)
        .filter(|s| {
            labels
                .iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .collect()
}

pub(super) fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let found = select(samples, name, labels);
    assert!(found.len() <= 1, "{name} {labels:?} matches {found:?}");
    found.first().map(|s| s.value)
}
