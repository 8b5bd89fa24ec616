//! Durations as the configuration and the query string spell them (`500ms`,
//! `30s`, `2m`, `1h`), in milliseconds. Pure.

/// Longest duration drain-gate accepts anywhere: a drain, a CLOSING, a held
/// `wait=closed`.
pub const MAX_MS: u64 = 3_600_000;

/// Parses `500ms`, `30s`, `2m`, `1h` into milliseconds; anything else
/// (at most 12 digits: no duration overflows) is an error that says so.
pub fn parse_ms(s: &str) -> Result<u64, String> {
    let not_a_duration = || format!("\"{s}\" is not a duration (use e.g. 500ms, 30s, 2m)");
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at_checked(split).unwrap_or_default();
    let scale = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(not_a_duration()),
    };
    match digits.parse::<u64>() {
        Ok(n) if digits.len() <= 12 => Ok(n.saturating_mul(scale)),
        _ => Err(not_a_duration()),
    }
}

/// Formats milliseconds the way the configuration spells durations.
pub fn format_ms(ms: u64) -> String {
    if ms != 0 && ms % 60_000 == 0 {
        format!("{}m", ms / 60_000)
    } else if ms % 1_000 == 0 {
        format!("{}s", ms / 1_000)
    } else {
        format!("{ms}ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_formats() {
        assert_eq!(parse_ms("0s"), Ok(0));
        assert_eq!(parse_ms("250ms"), Ok(250));
        assert_eq!(parse_ms("2m"), Ok(120_000));
        assert_eq!(parse_ms("1h"), Ok(3_600_000));
        for bad in [
            "",
            "s",
            "10",
            "1.5s",
            "10 s",
            "+1s",
            "99999999999999s",
            "1sec",
        ] {
            assert!(parse_ms(bad).is_err(), "{bad}");
        }
        assert_eq!(format_ms(120_000), "2m");
        assert_eq!(format_ms(10_000), "10s");
        assert_eq!(format_ms(1_500), "1500ms");
        assert_eq!(format_ms(0), "0s");
        assert_eq!(format_ms(MAX_MS), "60m");
    }
}
