//! `strftime_now(format)`: the date in a system prompt (Llama 3.1+ templates
//! write `Today Date: {{ strftime_now("%d %b %Y") }}`).
//!
//! The time is UTC (Python's `datetime.now()` is local time; servers run in UTC).
//! Supported codes: `%Y %y %m %d %e %H %I %M %S %p %b %B %a %A %j %%`; any
//! other is an error rather than a silent difference.

use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::{Error, ErrorKind};

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];

/// The template global.
pub(super) fn strftime_now(format: String) -> Result<String, Error> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    strftime_at(&format, now)
}

/// Formats the UTC time `unix_secs` with a subset of C's strftime.
pub(super) fn strftime_at(format: &str, unix_secs: i64) -> Result<String, Error> {
    let days = unix_secs.div_euclid(86_400);
    let secs = unix_secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (secs / 3600, secs / 60 % 60, secs % 60);
    // 1970-01-01 was a Thursday (index 3 from Monday).
    let weekday = (days + 3).rem_euclid(7) as usize;
    let day_of_year = days - days_from_civil(year, 1, 1) + 1;
    let month_name = MONTHS[(month - 1) as usize];
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };

    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let code = chars.next();
        let piece = match code {
            Some('Y') => year.to_string(),
            Some('y') => format!("{:02}", year.rem_euclid(100)),
            Some('m') => format!("{month:02}"),
            Some('d') => format!("{day:02}"),
            Some('e') => format!("{day:2}"),
            Some('H') => format!("{hour:02}"),
            Some('I') => format!("{hour12:02}"),
            Some('M') => format!("{minute:02}"),
            Some('S') => format!("{second:02}"),
            Some('p') => if hour < 12 { "AM" } else { "PM" }.to_string(),
            Some('b') => month_name[..3].to_string(),
            Some('B') => month_name.to_string(),
            Some('a') => WEEKDAYS[weekday][..3].to_string(),
            Some('A') => WEEKDAYS[weekday].to_string(),
            Some('j') => format!("{day_of_year:03}"),
            Some('%') => "%".to_string(),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("strftime_now: unsupported format code %{}", other.map(String::from).unwrap_or_default()),
                ))
            }
        };
        out.push_str(&piece);
    }
    Ok(out)
}

/// Days since 1970-01-01 → (year, month, day) (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// (year, month, day) → days since 1970-01-01.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_python() {
        // datetime.fromtimestamp(1709251199, timezone.utc) = Thu 2024-02-29 23:59:59
        let t = 1_709_251_199;
        assert_eq!(strftime_at("%d %b %Y", t).unwrap(), "29 Feb 2024");
        assert_eq!(
            strftime_at("%A %B %e, %y %H:%M:%S %I%p day %j %%", t).unwrap(),
            "Thursday February 29, 24 23:59:59 11PM day 060 %"
        );
        assert_eq!(strftime_at("%a %Y-%m-%d", 0).unwrap(), "Thu 1970-01-01");
        assert_eq!(strftime_at("%Y-%m-%d", -1).unwrap(), "1969-12-31");
        assert!(strftime_at("%Q", t).is_err());
        assert!(strftime_at("trailing %", t).is_err());
    }
}
