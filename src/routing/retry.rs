//! The timing rules of retries: which failures are retried, how long to wait before the next
//! attempt (exponential backoff with full jitter), and what a provider's Retry-After asks for.
//! Pure functions: the caller supplies the clock and the randomness from the host.

use crate::config::RetryConfig;

/// Spec 2.4 default when on_status_codes is absent.
pub(crate) const DEFAULT_RETRY_STATUS_CODES: [u16; 5] = [429, 500, 502, 503, 504];

/// First backoff ceiling. A transient overload usually clears within a few hundred
/// milliseconds, and 200 ms is small next to the seconds an LLM call itself takes.
const BACKOFF_BASE_MS: u64 = 200;
/// Largest backoff ceiling, reached from the sixth retry on. With the 10 attempts a config
/// may ask for, the waits add up to at most 31.2 s, which stays inside usual client timeouts;
/// a provider that needs longer says so with Retry-After.
const BACKOFF_CAP_MS: u64 = 5_000;
/// Longest Retry-After we wait for. Providers' per-minute rate-limit windows reset within
/// a minute, so waiting up to one is worth it; a longer wait means a quota or daily limit,
/// where holding the client's request open helps nobody: it gets the response to decide.
pub(crate) const MAX_RETRY_AFTER_MS: u64 = 60_000;

/// Whether a failed attempt may be retried by this rule; `status` None means a transport
/// failure or timeout (always retryable).
pub(crate) fn is_retryable(config: &RetryConfig, status: Option<u16>) -> bool {
    let Some(status) = status else {
        return true;
    };
    match &config.on_status_codes {
        Some(codes) => codes.contains(&status),
        None => DEFAULT_RETRY_STATUS_CODES.contains(&status),
    }
}

/// Exponential backoff with full jitter: a uniformly random delay in
/// [0, min(BACKOFF_CAP_MS, BACKOFF_BASE_MS * 2^retry)] ms for the retry with index `retry`
/// (0 = first retry); `random` is a uniformly random u64 from the host. Full jitter spreads
/// the retries of many clients hit by the same outage instead of having them return together.
pub(crate) fn backoff_ms(retry: u32, random: u64) -> u64 {
    // Saturating, so a huge `retry` just lands on the cap.
    let ceiling = 2u64.saturating_pow(retry).saturating_mul(BACKOFF_BASE_MS).min(BACKOFF_CAP_MS);
    // The modulo bias is below 2^-50 for a ceiling this small.
    random % (ceiling + 1)
}

/// What a provider's response asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RetryAfter {
    /// No usable Retry-After header.
    Absent,
    /// Wait this many milliseconds.
    Wait(u64),
    /// Longer than MAX_RETRY_AFTER_MS: do not retry, return the response.
    TooLong,
}

/// What the provider asked for, from the response headers (lowercase names, raw byte values):
/// `retry-after-ms` (milliseconds, may be fractional) wins over `retry-after` (delta-seconds
/// or an HTTP-date, RFC 9110 §10.2.3). A date in the past is Wait(0). An unparseable value
/// counts as absent, so a garbled `retry-after-ms` falls back to `retry-after`.
pub(crate) fn retry_after(headers: &[(String, Vec<u8>)], now_unix_ms: u64) -> RetryAfter {
    let wait_ms = header(headers, "retry-after-ms")
        .and_then(parse_milliseconds)
        .or_else(|| header(headers, "retry-after").and_then(|v| parse_retry_after(v, now_unix_ms)));
    match wait_ms {
        None => RetryAfter::Absent,
        Some(ms) if ms > MAX_RETRY_AFTER_MS => RetryAfter::TooLong,
        Some(ms) => RetryAfter::Wait(ms),
    }
}

/// The delay before the next retry: when the config honours Retry-After and the response
/// carried one, that (TooLong gives None: do not retry); otherwise backoff_ms.
pub(crate) fn next_delay(
    config: &RetryConfig,
    retry: u32,
    headers: &[(String, Vec<u8>)],
    now_unix_ms: u64,
    random: u64,
) -> Option<u64> {
    if config.use_retry_after_headers {
        match retry_after(headers, now_unix_ms) {
            RetryAfter::Wait(ms) => return Some(ms),
            RetryAfter::TooLong => return None,
            RetryAfter::Absent => {}
        }
    }
    Some(backoff_ms(retry, random))
}

/// The first value of a header, without surrounding whitespace.
fn header<'a>(headers: &'a [(String, Vec<u8>)], name: &str) -> Option<&'a [u8]> {
    headers.iter().find(|(n, _)| n == name).map(|(_, value)| value.trim_ascii())
}

/// `1*DIGIT`, saturating: a huge number is still a (too) long wait, not garbage.
fn parse_digits(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits
        .iter()
        .try_fold(0u64, |n, &b| b.is_ascii_digit().then(|| n.saturating_mul(10).saturating_add(u64::from(b - b'0'))))
}

/// `retry-after-ms`: `1*DIGIT ["." 1*DIGIT]`. A fraction rounds up, since retrying a little
/// late is harmless and a little early may be refused again.
fn parse_milliseconds(value: &[u8]) -> Option<u64> {
    let mut parts = value.splitn(2, |&b| b == b'.');
    let whole = parse_digits(parts.next()?)?;
    let Some(fraction) = parts.next() else {
        return Some(whole);
    };
    let fraction = parse_digits(fraction)?;
    Some(if fraction > 0 { whole.saturating_add(1) } else { whole })
}

/// `retry-after`: delta-seconds, or an HTTP-date turned into the wait from `now_unix_ms`.
fn parse_retry_after(value: &[u8], now_unix_ms: u64) -> Option<u64> {
    if let Some(seconds) = parse_digits(value) {
        return Some(seconds.saturating_mul(1000));
    }
    let date_ms = i128::from(parse_http_date(value, now_unix_ms)?) * 1000;
    let wait_ms = date_ms - i128::from(now_unix_ms);
    // Past dates wait 0; the difference exceeds u64 only if the date is far away anyway.
    Some(u64::try_from(wait_ms.max(0)).unwrap_or(u64::MAX))
}

const DAY_NAMES: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
const LONG_DAY_NAMES: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];
const MONTH_NAMES: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];

/// An HTTP-date (RFC 9110 §5.6.7) in any of its three forms, as Unix seconds. Names are
/// case-sensitive as the grammar says. The day name is checked for form only: it repeats
/// what the date says, and a mismatch would not change when to retry.
fn parse_http_date(value: &[u8], now_unix_ms: u64) -> Option<i64> {
    imf_fixdate(value).or_else(|| rfc850_date(value, now_unix_ms)).or_else(|| asctime_date(value))
}

/// `Sun, 06 Nov 1994 08:49:37 GMT`
fn imf_fixdate(value: &[u8]) -> Option<i64> {
    let mut c = Cursor(value);
    c.name(&DAY_NAMES)?;
    c.literal(", ")?;
    let day = c.digits(2)?;
    c.literal(" ")?;
    let month = c.name(&MONTH_NAMES)? + 1;
    c.literal(" ")?;
    let year = c.digits(4)?;
    c.literal(" ")?;
    let time = c.time_of_day()?;
    c.literal(" GMT")?;
    c.end()?;
    unix_seconds(i64::from(year), month, day, time)
}

/// `Sunday, 06-Nov-94 08:49:37 GMT` (obsolete, two-digit year)
fn rfc850_date(value: &[u8], now_unix_ms: u64) -> Option<i64> {
    let mut c = Cursor(value);
    c.name(&LONG_DAY_NAMES)?;
    c.literal(", ")?;
    let day = c.digits(2)?;
    c.literal("-")?;
    let month = c.name(&MONTH_NAMES)? + 1;
    c.literal("-")?;
    let two_digit_year = c.digits(2)?;
    c.literal(" ")?;
    let time = c.time_of_day()?;
    c.literal(" GMT")?;
    c.end()?;
    let year = full_year(i64::from(two_digit_year), current_year(now_unix_ms));
    unix_seconds(year, month, day, time)
}

/// `Sun Nov  6 08:49:37 1994` (obsolete, the day padded with a space or a zero)
fn asctime_date(value: &[u8]) -> Option<i64> {
    let mut c = Cursor(value);
    c.name(&DAY_NAMES)?;
    c.literal(" ")?;
    let month = c.name(&MONTH_NAMES)? + 1;
    c.literal(" ")?;
    let day = if c.literal(" ").is_some() { c.digits(1)? } else { c.digits(2)? };
    c.literal(" ")?;
    let time = c.time_of_day()?;
    c.literal(" ")?;
    let year = c.digits(4)?;
    c.end()?;
    unix_seconds(i64::from(year), month, day, time)
}

/// RFC 9110 §5.6.7: a two-digit year that would be more than 50 years in the future means
/// the most recent past year with those digits; so the year lands in
/// [current - 49, current + 50].
fn full_year(two_digit_year: i64, current_year: i64) -> i64 {
    let year = current_year + (two_digit_year - current_year).rem_euclid(100);
    if year > current_year + 50 {
        year - 100
    } else {
        year
    }
}

/// The UTC year at `now_unix_ms` (civil_from_days, H. Hinnant, reduced to the year).
fn current_year(now_unix_ms: u64) -> i64 {
    // Lossless: u64::MAX milliseconds are about 2.1e11 days.
    let days = (now_unix_ms / 86_400_000) as i64;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    // Counted from March 1, so January and February belong to the next civil year.
    let from_march = (5 * day_of_year + 2) / 153;
    era * 400 + year_of_era + i64::from(from_march >= 10)
}

/// Hours, minutes and seconds of a time-of-day.
type Time = (u32, u32, u32);

/// Unix seconds of a UTC date and time, or None when a field is out of range. Second 60 is
/// a leap second, which the grammar allows; Unix time counts it as the next minute's first.
fn unix_seconds(year: i64, month: u32, day: u32, (hour, minute, second): Time) -> Option<i64> {
    if day == 0 || day > days_in_month(year, month) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let seconds_of_day = i64::from(hour * 3600 + minute * 60 + second);
    Some(days_from_civil(year, month, day) * 86_400 + seconds_of_day)
}

fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        2 if is_leap_year(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

fn is_leap_year(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (days_from_civil, H. Hinnant).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    // Count years from March 1, so the leap day is the last day of its year.
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_from_march = i64::from(if month > 2 { month - 3 } else { month + 9 });
    let day_of_year = (153 * month_from_march + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// Reads an HTTP-date left to right; every step is None when the input does not match.
struct Cursor<'a>(&'a [u8]);

impl Cursor<'_> {
    fn literal(&mut self, text: &str) -> Option<()> {
        self.0 = self.0.strip_prefix(text.as_bytes())?;
        Some(())
    }

    /// Exactly `n` ASCII digits.
    fn digits(&mut self, n: usize) -> Option<u32> {
        let (digits, rest) = self.0.split_at_checked(n)?;
        let value = digits.iter().try_fold(0u32, |v, &b| b.is_ascii_digit().then(|| v * 10 + u32::from(b - b'0')))?;
        self.0 = rest;
        Some(value)
    }

    /// The index of the name that comes next.
    fn name(&mut self, names: &[&str]) -> Option<u32> {
        let (index, rest) =
            names.iter().enumerate().find_map(|(i, name)| Some((i, self.0.strip_prefix(name.as_bytes())?)))?;
        self.0 = rest;
        u32::try_from(index).ok()
    }

    /// `HH:MM:SS`
    fn time_of_day(&mut self) -> Option<Time> {
        let hour = self.digits(2)?;
        self.literal(":")?;
        let minute = self.digits(2)?;
        self.literal(":")?;
        let second = self.digits(2)?;
        Some((hour, minute, second))
    }

    fn end(&self) -> Option<()> {
        self.0.is_empty().then_some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;

    /// Sun, 06 Nov 1994 08:49:37 GMT
    const NOV_1994: u64 = 784_111_777;

    fn config(on_status_codes: Option<Vec<u16>>, use_retry_after_headers: bool) -> RetryConfig {
        RetryConfig { attempts: 3, on_status_codes, use_retry_after_headers }
    }

    fn headers(pairs: &[(&str, &str)]) -> Vec<(String, Vec<u8>)> {
        pairs.iter().map(|(n, v)| (n.to_string(), v.as_bytes().to_vec())).collect()
    }

    /// Retry-After for a single `retry-after` value, `now` in Unix seconds.
    fn after(value: &str, now: u64) -> RetryAfter {
        retry_after(&headers(&[("retry-after", value)]), now * 1000)
    }

    /// The Unix seconds of an HTTP-date, seen from 2025.
    fn date(value: &str) -> Option<i64> {
        parse_http_date(value.as_bytes(), 1_750_000_000_000)
    }

    #[test]
    fn default_status_codes() {
        let c = config(None, false);
        for status in DEFAULT_RETRY_STATUS_CODES {
            assert!(is_retryable(&c, Some(status)), "{status}");
        }
        for status in [200, 400, 401, 403, 404, 408, 501, 505] {
            assert!(!is_retryable(&c, Some(status)), "{status}");
        }
    }

    #[test]
    fn custom_status_codes_replace_the_defaults() {
        let c = config(Some(vec![408, 529]), false);
        assert!(is_retryable(&c, Some(408)));
        assert!(is_retryable(&c, Some(529)));
        assert!(!is_retryable(&c, Some(429)));
        assert!(!is_retryable(&c, Some(503)));
        assert!(!is_retryable(&config(Some(vec![]), false), Some(503)));
    }

    #[test]
    fn transport_failures_are_always_retryable() {
        assert!(is_retryable(&config(None, false), None));
        assert!(is_retryable(&config(Some(vec![]), false), None));
    }

    #[test]
    fn backoff_stays_within_a_growing_capped_ceiling() {
        let randoms = [0, 1, 199, 200, 201, 4_999, 5_000, 5_001, 123_456_789, u64::MAX / 2, u64::MAX - 1, u64::MAX];
        let mut previous_ceiling = 0;
        for retry in 0..40 {
            let ceiling = BACKOFF_CAP_MS.min(BACKOFF_BASE_MS << retry.min(10));
            assert!(ceiling >= previous_ceiling);
            previous_ceiling = ceiling;
            assert_eq!(backoff_ms(retry, 0), 0);
            // random ≡ ceiling (mod ceiling + 1) gives the ceiling itself.
            assert_eq!(backoff_ms(retry, ceiling), ceiling);
            assert_eq!(backoff_ms(retry, ceiling + 1), 0);
            for random in randoms {
                assert!(backoff_ms(retry, random) <= ceiling, "retry {retry}, random {random}");
            }
        }
        assert_eq!(backoff_ms(0, 200), 200);
        assert_eq!(backoff_ms(0, 201), 0);
        assert_eq!(backoff_ms(1, 400), 400);
        assert_eq!(backoff_ms(4, 3_200), 3_200);
        assert_eq!(backoff_ms(4, 3_201), 0);
        assert_eq!(backoff_ms(5, 5_000), BACKOFF_CAP_MS);
    }

    #[test]
    fn backoff_with_a_huge_retry_index_does_not_overflow() {
        for retry in [63, 64, 65, 1_000, u32::MAX] {
            assert_eq!(backoff_ms(retry, 5_000), BACKOFF_CAP_MS);
            assert!(backoff_ms(retry, u64::MAX) <= BACKOFF_CAP_MS);
        }
    }

    #[test]
    fn delta_seconds() {
        assert_eq!(after("3", 0), RetryAfter::Wait(3_000));
        assert_eq!(after("0", 0), RetryAfter::Wait(0));
        assert_eq!(after(" 7\t", 0), RetryAfter::Wait(7_000));
        assert_eq!(after("60", 0), RetryAfter::Wait(MAX_RETRY_AFTER_MS));
    }

    #[test]
    fn milliseconds_round_fractions_up() {
        let ms = |value: &str| retry_after(&headers(&[("retry-after-ms", value)]), 0);
        assert_eq!(ms("1500"), RetryAfter::Wait(1_500));
        assert_eq!(ms("1500.5"), RetryAfter::Wait(1_501));
        assert_eq!(ms("1500.000"), RetryAfter::Wait(1_500));
        assert_eq!(ms("0.1"), RetryAfter::Wait(1));
        assert_eq!(ms("60000.0"), RetryAfter::Wait(MAX_RETRY_AFTER_MS));
        assert_eq!(ms("60000.01"), RetryAfter::TooLong);
        for garbage in ["", ".5", "5.", "1.2.3", "1e3", "-5", "+5", "5 ms", "NaN"] {
            assert_eq!(ms(garbage), RetryAfter::Absent, "{garbage:?}");
        }
    }

    #[test]
    fn milliseconds_win_over_seconds() {
        let h = headers(&[("retry-after", "30"), ("retry-after-ms", "250")]);
        assert_eq!(retry_after(&h, 0), RetryAfter::Wait(250));
        let h = headers(&[("retry-after-ms", "250"), ("retry-after", "Sun, 06 Nov 1994 08:50:07 GMT")]);
        assert_eq!(retry_after(&h, NOV_1994 * 1000), RetryAfter::Wait(250));
        // Unusable milliseconds fall back to the seconds.
        let h = headers(&[("retry-after-ms", "soon"), ("retry-after", "2")]);
        assert_eq!(retry_after(&h, 0), RetryAfter::Wait(2_000));
    }

    #[test]
    fn too_long_waits() {
        assert_eq!(after("61", 0), RetryAfter::TooLong);
        assert_eq!(after("86400", 0), RetryAfter::TooLong);
        // Beyond u64: still a wait far too long, not garbage.
        assert_eq!(after("99999999999999999999999999", 0), RetryAfter::TooLong);
        let h = headers(&[("retry-after-ms", "99999999999999999999999999.9")]);
        assert_eq!(retry_after(&h, 0), RetryAfter::TooLong);
        assert_eq!(after("Sun, 06 Nov 1994 08:50:38 GMT", NOV_1994), RetryAfter::TooLong);
        assert_eq!(after("Fri, 31 Dec 9999 23:59:59 GMT", 0), RetryAfter::TooLong);
    }

    #[test]
    fn garbage_and_negative_numbers_are_absent() {
        assert_eq!(retry_after(&[], 0), RetryAfter::Absent);
        assert_eq!(retry_after(&headers(&[("x-retry-after", "3")]), 0), RetryAfter::Absent);
        for garbage in
            ["", " ", "-1", "-0", "+3", "3.5", "1e3", "three", "3 s", "0x10", "Sun, 06 Nov 1994", "\u{feff}3"]
        {
            assert_eq!(after(garbage, 0), RetryAfter::Absent, "{garbage:?}");
        }
        let h = vec![("retry-after".to_string(), vec![0xff, 0x33])];
        assert_eq!(retry_after(&h, 0), RetryAfter::Absent);
    }

    #[test]
    fn the_three_date_forms() {
        let expected = Some(NOV_1994 as i64);
        assert_eq!(date("Sun, 06 Nov 1994 08:49:37 GMT"), expected);
        assert_eq!(date("Sunday, 06-Nov-94 08:49:37 GMT"), expected);
        assert_eq!(date("Sun Nov  6 08:49:37 1994"), expected);
        assert_eq!(date("Sun Nov 06 08:49:37 1994"), expected);
        assert_eq!(date("Thu, 01 Jan 1970 00:00:00 GMT"), Some(0));
        assert_eq!(date("Wed, 31 Dec 1969 23:59:59 GMT"), Some(-1));
        assert_eq!(date("Tue, 19 Jan 2038 03:14:08 GMT"), Some(1 << 31));
        assert_eq!(date("Sat, 01 Jan 2000 00:00:00 GMT"), Some(946_684_800));
        assert_eq!(date("Sun, 14 Jun 2026 12:00:00 GMT"), Some(1_781_438_400));
        // A leap second counts as the next minute's first second.
        assert_eq!(date("Sat, 31 Dec 2016 23:59:60 GMT"), Some(1_483_228_800));
    }

    #[test]
    fn leap_years() {
        assert_eq!(date("Thu, 29 Feb 1996 00:00:00 GMT"), Some(825_552_000));
        assert_eq!(date("Tue, 29 Feb 2000 00:00:00 GMT"), Some(951_782_400));
        assert_eq!(date("Thu, 29 Feb 2024 12:00:00 GMT"), Some(1_709_208_000));
        assert_eq!(date("Fri, 01 Mar 2024 00:00:00 GMT"), Some(1_709_251_200));
        assert_eq!(date("Tue, 31 Dec 2024 00:00:00 GMT"), Some(1_735_603_200));
        // 1900 and 2100 are not leap years (divisible by 100), 2000 is (by 400).
        assert_eq!(date("Thu, 29 Feb 1900 00:00:00 GMT"), None);
        assert_eq!(date("Mon, 29 Feb 2100 00:00:00 GMT"), None);
        assert_eq!(date("Sat, 29 Feb 2025 00:00:00 GMT"), None);
        assert_eq!(date("Thursday, 29-Feb-24 00:00:00 GMT"), Some(1_709_164_800));
        assert_eq!(date("Thu Feb 29 00:00:00 2024"), Some(1_709_164_800));
    }

    #[test]
    fn two_digit_years_stay_within_50_years() {
        assert_eq!(full_year(94, 2025), 1994);
        assert_eq!(full_year(25, 2025), 2025);
        assert_eq!(full_year(75, 2025), 2075);
        assert_eq!(full_year(76, 2025), 1976);
        assert_eq!(full_year(0, 2025), 2000);
        assert_eq!(full_year(1, 2099), 2101);
        assert_eq!(full_year(49, 2099), 2149);
        assert_eq!(full_year(50, 2099), 2050);
        assert_eq!(current_year(0), 1970);
        assert_eq!(current_year(NOV_1994 * 1000), 1994);
        assert_eq!(current_year(1_735_689_599_999), 2024);
        assert_eq!(current_year(1_735_689_600_000), 2025);
        assert_eq!(current_year(951_782_400_000), 2000);
        assert!(current_year(u64::MAX) > 584_000_000);
        // From 2090, "01" is 2101, 11 years ahead, not 2001.
        let now_2090 = 3_786_912_000_000;
        assert_eq!(current_year(now_2090), 2090);
        assert_eq!(parse_http_date(b"Saturday, 01-Jan-01 00:00:00 GMT", now_2090), Some(4_133_980_800));
    }

    #[test]
    fn malformed_dates() {
        for garbage in [
            "Sun, 06 Nov 1994 08:49:37 UTC",
            "Sun, 06 Nov 1994 08:49:37 gmt",
            "sun, 06 Nov 1994 08:49:37 GMT",
            "Sun, 06 nov 1994 08:49:37 GMT",
            "Sun, 6 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nov 94 08:49:37 GMT",
            "Sun, 06 Nov 1994 8:49:37 GMT",
            "Sun, 06 Nov 1994 08:49:37 GMT trailing",
            "Sun,  06 Nov 1994 08:49:37 GMT",
            "Sunday, 06 Nov 1994 08:49:37 GMT",
            "Sun, 06-Nov-94 08:49:37 GMT",
            "Sunday, 06-Nov-1994 08:49:37 GMT",
            "Sun Nov 6 08:49:37 1994",
            "Sun Nov  6 08:49:37 1994 GMT",
            "Sun, 00 Nov 1994 08:49:37 GMT",
            "Sun, 31 Nov 1994 08:49:37 GMT",
            "Sun, 32 Jan 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 24:00:00 GMT",
            "Sun, 06 Nov 1994 08:60:00 GMT",
            "Sun, 06 Nov 1994 08:49:61 GMT",
            "Sun, 06 Nov 1994 -8:49:37 GMT",
            "Sun, 06 Nov +994 08:49:37 GMT",
            "Xyz, 06 Nov 1994 08:49:37 GMT",
            "Sun, 06 Foo 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 08:49:3",
            "Sun, 06 Nov 1994 08:49:37 GM",
            "Sun",
            "",
        ] {
            assert_eq!(date(garbage), None, "{garbage:?}");
        }
        // Multi-byte UTF-8 where a digit belongs does not split a character or panic.
        assert_eq!(date("Sun, 0\u{e9} Nov 1994 08:49:37 GMT"), None);
    }

    #[test]
    fn dates_give_the_wait_from_now() {
        assert_eq!(after("Sun, 06 Nov 1994 08:50:07 GMT", NOV_1994), RetryAfter::Wait(30_000));
        assert_eq!(after("Sunday, 06-Nov-94 08:50:37 GMT", NOV_1994), RetryAfter::Wait(MAX_RETRY_AFTER_MS));
        assert_eq!(after("Sun Nov  6 08:49:38 1994", NOV_1994), RetryAfter::Wait(1_000));
        // Now is partway through a second: the wait is to the millisecond.
        let h = headers(&[("retry-after", "Sun, 06 Nov 1994 08:49:40 GMT")]);
        assert_eq!(retry_after(&h, NOV_1994 * 1000 + 250), RetryAfter::Wait(2_750));
    }

    #[test]
    fn past_dates_wait_nothing() {
        assert_eq!(after("Sun, 06 Nov 1994 08:49:37 GMT", NOV_1994), RetryAfter::Wait(0));
        assert_eq!(after("Sun, 06 Nov 1994 08:49:36 GMT", NOV_1994), RetryAfter::Wait(0));
        assert_eq!(after("Thu, 01 Jan 1970 00:00:00 GMT", NOV_1994), RetryAfter::Wait(0));
        assert_eq!(after("Mon, 01 Jan 0001 00:00:00 GMT", NOV_1994), RetryAfter::Wait(0));
        assert_eq!(after("Sun, 06 Nov 1994 08:49:37 GMT", u64::MAX / 1000), RetryAfter::Wait(0));
    }

    #[test]
    fn next_delay_honours_retry_after_only_when_configured() {
        let honour = config(None, true);
        let ignore = config(None, false);
        let asked = headers(&[("retry-after", "2")]);
        let too_long = headers(&[("retry-after", "3600")]);
        assert_eq!(next_delay(&honour, 0, &asked, 0, 150), Some(2_000));
        assert_eq!(next_delay(&honour, 0, &too_long, 0, 150), None);
        assert_eq!(next_delay(&honour, 0, &headers(&[("retry-after", "soon")]), 0, 150), Some(150));
        assert_eq!(next_delay(&honour, 3, &[], 0, 150), Some(backoff_ms(3, 150)));
        assert_eq!(next_delay(&ignore, 0, &asked, 0, 150), Some(150));
        assert_eq!(next_delay(&ignore, 0, &too_long, 0, 150), Some(150));
        assert_eq!(next_delay(&ignore, u32::MAX, &too_long, 0, 5_000), Some(BACKOFF_CAP_MS));
    }
}
