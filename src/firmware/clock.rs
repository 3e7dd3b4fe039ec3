//! The firmware controller's clock: Unix seconds, and their RFC 3339 form
//! for status times.

pub(crate) fn rfc3339(secs: i64) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time> {
    k8s_openapi::jiff::Timestamp::from_second(secs)
        .ok()
        .map(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time)
}

pub(crate) fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default()
}
