//! The pieces of Go's standard library go-yaml and `encoding/json` lean on, as they behave:
//! `strconv`'s integer and float parsing and `FormatFloat`, `time.Parse` for go-yaml's
//! timestamp layouts, and how `json.Marshal` writes bytes that are not UTF-8.

/// Why a Go `strconv` integer parse failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NumError {
    Syntax,
    Range,
}

/// Go's `strconv.ParseUint(s, 0, 64)` (no underscores: resolve.go removed them): `0x`, `0o`,
/// `0b` prefixes (either case) and a bare leading `0` for octal; no sign.
pub(super) fn go_parse_uint(s: &str) -> Result<u64, NumError> {
    let b = s.as_bytes();
    if b.is_empty() {
        return Err(NumError::Syntax);
    }
    let (base, digits): (u64, &[u8]) = if b[0] == b'0' {
        match b.get(1).map(u8::to_ascii_lowercase) {
            Some(b'b') if b.len() >= 3 => (2, &b[2..]),
            Some(b'o') if b.len() >= 3 => (8, &b[2..]),
            Some(b'x') if b.len() >= 3 => (16, &b[2..]),
            _ => (8, &b[1..]),
        }
    } else {
        (10, b)
    };
    let mut n: u64 = 0;
    for &c in digits {
        let d = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'z' | b'A'..=b'Z' => c.to_ascii_lowercase() - b'a' + 10,
            _ => return Err(NumError::Syntax),
        } as u64;
        if d >= base {
            return Err(NumError::Syntax);
        }
        n = n
            .checked_mul(base)
            .and_then(|n| n.checked_add(d))
            .ok_or(NumError::Range)?;
    }
    Ok(n)
}

/// Go's `strconv.ParseInt(s, 0, 64)`: an optional sign, then [`go_parse_uint`], in range.
pub(super) fn go_parse_int(s: &str) -> Result<i64, NumError> {
    let (neg, rest) = match s.as_bytes().first() {
        Some(b'+') => (false, &s[1..]),
        Some(b'-') => (true, &s[1..]),
        _ => (false, s),
    };
    let un = go_parse_uint(rest)?;
    const CUTOFF: u64 = 1 << 63;
    match (neg, un) {
        (false, u) if u >= CUTOFF => Err(NumError::Range),
        (true, u) if u > CUTOFF => Err(NumError::Range),
        (true, u) => Ok((u as i64).wrapping_neg()),
        (false, u) => Ok(u as i64),
    }
}

/// Go's `strconv.ParseFloat(s, 64)` for decimal text (the only kind resolve.go hands it:
/// text starting with `.`, or text its float pattern matched): digits with at most one `.`,
/// an optional exponent, underscores only between digits; `None` on a syntax error or when
/// the value overflows (ErrRange; an underflow to zero is no error in Go).
pub(super) fn go_parse_float(s: &str) -> Option<f64> {
    let b = s.as_bytes();
    let mut i = 0;
    if matches!(b.first(), Some(b'+' | b'-')) {
        i += 1;
    }
    let (mut saw_dot, mut saw_digits, mut underscores) = (false, false, false);
    while i < b.len() {
        match b[i] {
            b'_' => underscores = true,
            b'.' if !saw_dot => saw_dot = true,
            b'0'..=b'9' => saw_digits = true,
            _ => break,
        }
        i += 1;
    }
    if !saw_digits {
        return None;
    }
    if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if !b.get(i).is_some_and(u8::is_ascii_digit) {
            return None;
        }
        while i < b.len() && (b[i].is_ascii_digit() || b[i] == b'_') {
            underscores |= b[i] == b'_';
            i += 1;
        }
    }
    if i != b.len() || (underscores && !go_underscore_ok(s)) {
        return None;
    }
    let f: f64 = s.replace('_', "").parse().ok()?;
    f.is_finite().then_some(f)
}

/// Go's `strconv.underscoreOK`: underscores only between digits (or after a base prefix).
fn go_underscore_ok(s: &str) -> bool {
    let b = s.as_bytes();
    let b = match b.first() {
        Some(b'+' | b'-') => &b[1..],
        _ => b,
    };
    let mut saw = b'^';
    let mut i = 0;
    let mut hex = false;
    if b.len() >= 2 && b[0] == b'0' && matches!(b[1].to_ascii_lowercase(), b'b' | b'o' | b'x') {
        i = 2;
        saw = b'0';
        hex = b[1].eq_ignore_ascii_case(&b'x');
    }
    while i < b.len() {
        let c = b[i];
        i += 1;
        if c.is_ascii_digit() || (hex && c.is_ascii_hexdigit()) {
            saw = b'0';
            continue;
        }
        if c == b'_' {
            if saw != b'0' {
                return false;
            }
            saw = b'_';
            continue;
        }
        if saw == b'_' {
            return false;
        }
        saw = b'!';
    }
    saw != b'_'
}

/// resolve.go `parseTimestamp`: four digits and `-` first, then one of go-yaml's layouts
/// (`2006-1-2T15:4:5.999999999Z07:00`, the same with `t`, `2006-1-2 15:4:5.999999999`,
/// `2006-1-2`) as Go's `time.Parse` reads them (1- or 2-digit fields, ranges checked).
pub(super) fn parse_timestamp(s: &str) -> bool {
    let b = s.as_bytes();
    let lead = b.iter().take_while(|c| c.is_ascii_digit()).count();
    if lead != 4 || b.get(4) != Some(&b'-') {
        return false;
    }
    let year: u32 = s[..4].parse().unwrap_or(0);
    let mut rest = &b[5..];
    let Some(month) = getnum(&mut rest).filter(|m| (1..=12).contains(m)) else {
        return false;
    };
    if !eat(&mut rest, b'-') {
        return false;
    }
    let Some(day) = getnum(&mut rest) else {
        return false;
    };
    let leap = year.is_multiple_of(4) && (!year.is_multiple_of(100) || year.is_multiple_of(400));
    let days = match month {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    };
    if day < 1 || day > days {
        return false;
    }
    if rest.is_empty() {
        return true;
    }
    let zoned = match rest[0] {
        b'T' | b't' => true,
        b' ' => false,
        _ => return false,
    };
    rest = &rest[1..];
    let clock = getnum(&mut rest).is_some_and(|h| h < 24)
        && eat(&mut rest, b':')
        && getnum(&mut rest).is_some_and(|m| m < 60)
        && eat(&mut rest, b':')
        && getnum(&mut rest).is_some_and(|s| s < 60);
    if !clock {
        return false;
    }
    // ".999999999": an optional fraction (`.` or `,` then digits).
    if rest.len() >= 2 && matches!(rest[0], b'.' | b',') && rest[1].is_ascii_digit() {
        let n = 1 + rest[1..].iter().take_while(|c| c.is_ascii_digit()).count();
        rest = &rest[n..];
    }
    if !zoned {
        return rest.is_empty();
    }
    // "Z07:00": `Z`, or a sign, two digits, `:`, two digits (hours up to 24, minutes to 60).
    if rest == b"Z" {
        return true;
    }
    rest.len() == 6
        && matches!(rest[0], b'+' | b'-')
        && rest[3] == b':'
        && [1, 2, 4, 5].iter().all(|&i| rest[i].is_ascii_digit())
        && (rest[1] - b'0') * 10 + (rest[2] - b'0') <= 24
        && (rest[4] - b'0') * 10 + (rest[5] - b'0') <= 60
}

/// Go's `getnum(s, false)`: one digit, or two when the second is a digit too.
fn getnum(s: &mut &[u8]) -> Option<u32> {
    let first = *s.first().filter(|c| c.is_ascii_digit())?;
    match s.get(1).filter(|c| c.is_ascii_digit()) {
        Some(&second) => {
            *s = &s[2..];
            Some(u32::from(first - b'0') * 10 + u32::from(second - b'0'))
        }
        None => {
            *s = &s[1..];
            Some(u32::from(first - b'0'))
        }
    }
}

fn eat(s: &mut &[u8], c: u8) -> bool {
    if s.first() == Some(&c) {
        *s = &s[1..];
        true
    } else {
        false
    }
}

/// Bytes as Go's `json.Marshal` writes a string: each byte of an invalid UTF-8 sequence
/// becomes U+FFFD.
pub(super) fn go_json_string(bytes: &[u8]) -> String {
    let mut out = String::new();
    let mut rest = bytes;
    loop {
        match std::str::from_utf8(rest) {
            Ok(s) => {
                out.push_str(s);
                return out;
            }
            Err(e) => {
                let (good, bad) = rest.split_at(e.valid_up_to());
                out.push_str(std::str::from_utf8(good).unwrap_or_default());
                let n = e.error_len().unwrap_or(bad.len());
                out.extend(std::iter::repeat_n('\u{fffd}', n));
                rest = &bad[n..];
            }
        }
    }
}

/// Go's `strconv.FormatFloat(f, 'g', -1, 32)`: the shortest digits that read back as the same
/// float32, in `%e` form when the exponent is below -4 or at least 6 (the precision Go uses for
/// shortest `g`), else in `%f` form.
pub(super) fn go_format_g32(f: f64) -> String {
    let x = f as f32;
    if x.is_nan() {
        return ".nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { ".inf" } else { "-.inf" }.into();
    }
    let sign = if x.is_sign_negative() { "-" } else { "" };
    if x == 0.0 {
        return format!("{sign}0");
    }
    // Rust's `{:e}` prints the shortest round-trip digits: "1.2345e-7".
    let e = format!("{:e}", x.abs());
    let (mant, exp) = e.split_once('e').unwrap_or((&e, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mant.chars().filter(|c| *c != '.').collect();
    let nd = digits.len() as i32;
    if !(-4..6).contains(&exp) {
        let mut out = format!("{sign}{}", &digits[..1]);
        if nd > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let (es, ea) = if exp < 0 { ('-', -exp) } else { ('+', exp) };
        out.push_str(&format!("e{es}{ea:02}"));
        return out;
    }
    let dp = exp + 1;
    let digit = |i: i32| -> char {
        if i >= 0 && i < nd {
            digits.as_bytes()[i as usize] as char
        } else {
            '0'
        }
    };
    let mut out = sign.to_owned();
    if dp > 0 {
        for i in 0..dp {
            out.push(digit(i));
        }
    } else {
        out.push('0');
    }
    let frac = (nd - dp).max(0);
    if frac > 0 {
        out.push('.');
        for i in 0..frac {
            out.push(digit(dp + i));
        }
    }
    out
}
