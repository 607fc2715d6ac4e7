//! `ETag`s on the boot PATCH: the `If-Match` forms tried for one tag, how often a stale tag
//! is read again, and what the operator is told when it stays stale.

use reqwest::StatusCode;

/// The `If-Match` values a PATCH is tried with for one `ETag` its GET answered (the order of
/// openstack/sushy 5.8.0, sushy/connector.py `_etag_handler`, which ironic drives real BMCs
/// with): the tag itself, then for a weak `W/"x"` its strong form `"x"` (RFC 7232 section
/// 3.1 compares `If-Match` strongly, so a weak tag never matches there; BMCs that hand out
/// weak tags take the strong form). A 412 moves to the next form.
pub fn if_match_forms(etag: &str) -> Vec<String> {
    let tag = etag.trim();
    let mut out = vec![tag.to_owned()];
    if let Some(strong) = tag.strip_prefix("W/")
        && strong.len() >= 2
        && strong.starts_with('"')
        && strong.ends_with('"')
    {
        out.push(strong.to_owned());
    }
    out
}

/// How many times the ComputerSystem is read for one boot override whose ETag keeps going
/// stale (412 on every form of it) before talboot tries once without `If-Match` (sushy's last
/// resort) and then gives up.
pub const ETAG_READS: u32 = 4;

/// Why a boot override failed after its ETag went stale on every read: what happened, with
/// the count, and what the unconditional last try answered.
pub fn stale_etag_reason(reads: u32, last_tag: &str, unconditional: StatusCode) -> String {
    let after = if unconditional == StatusCode::PRECONDITION_REQUIRED {
        "without If-Match the BMC answered 428 Precondition Required (it takes no \
         unconditional change)"
            .to_string()
    } else {
        format!("without If-Match it answered {unconditional}")
    };
    format!(
        "the BMC answered 412 Precondition Failed to every If-Match: the ComputerSystem's ETag \
         went stale {reads} times in a row between talboot's read and its PATCH (talboot \
         re-read it and tried again each time; the last ETag was {last_tag}), and {after}; \
         something else keeps changing the system (another client, or the BMC itself): try \
         again"
    )
}
