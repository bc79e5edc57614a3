//! Field values as they are stored, and the Python-compatible text forms the
//! seed's tokens and comparisons are defined over.
//!
//! A registry value keeps its storage class (SQLite INTEGER / REAL / TEXT /
//! BLOB / NULL, or the JSON type in a fixture): `900`, `900.0` and `"900"`
//! probe and parse differently even though they hash the same. This module
//! must never guess a type: it only renders what it was given.

use serde_json::Value as Json;
use std::borrow::Cow;

/// One stored field value, with its storage class.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// SQL NULL, JSON null, or a column the registry does not have.
    Null,
    /// SQLite INTEGER or a JSON integer.
    Int(i64),
    /// SQLite REAL or a JSON number with a fraction or exponent.
    Real(f64),
    /// SQLite TEXT or a JSON string.
    Text(Text),
    /// A JSON boolean (SQLite has no boolean storage class).
    Bool(bool),
    /// SQLite BLOB.
    Blob(Box<[u8]>),
}

/// A stored value borrowed from where it is kept: a row's cells, a lease, a
/// [`Value`]. It has every reading method a [`Value`] has; the row model
/// hands these out so that reading a field copies nothing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Val<'a> {
    /// SQL NULL, JSON null, or a column the registry does not have.
    Null,
    /// SQLite INTEGER or a JSON integer.
    Int(i64),
    /// SQLite REAL or a JSON number with a fraction or exponent.
    Real(f64),
    /// SQLite TEXT or a JSON string.
    Text(&'a str),
    /// A JSON boolean.
    Bool(bool),
    /// SQLite BLOB.
    Blob(&'a [u8]),
}

impl<'a> Val<'a> {
    /// The storage class, as a word.
    pub fn kind(self) -> &'static str {
        match self {
            Val::Null => "null",
            Val::Int(_) => "integer",
            Val::Real(_) => "real",
            Val::Text(_) => "text",
            Val::Bool(_) => "bool",
            Val::Blob(_) => "blob",
        }
    }

    /// An owned copy.
    pub fn to_value(self) -> Value {
        match self {
            Val::Null => Value::Null,
            Val::Int(i) => Value::Int(i),
            Val::Real(f) => Value::Real(f),
            Val::Text(s) => Value::Text(s.into()),
            Val::Bool(b) => Value::Bool(b),
            Val::Blob(b) => Value::Blob(b.into()),
        }
    }

    /// SQL NULL (or an absent column).
    pub fn is_null(self) -> bool {
        matches!(self, Val::Null)
    }

    /// The seed's canonical text (`_canon`): what every token hashes.
    pub fn canon(self) -> String {
        match self {
            Val::Null => String::new(),
            Val::Bool(b) => if b { "true" } else { "false" }.to_string(),
            Val::Int(i) => i.to_string(),
            Val::Real(f) => {
                if f.is_finite() && f.fract() == 0.0 {
                    exact_integer_text(f)
                } else {
                    float_repr(f)
                }
            }
            Val::Text(s) => s.to_string(),
            Val::Blob(b) => bytes_repr(b),
        }
    }

    /// The canonical text, borrowed when the value is text or NULL.
    pub fn canon_cow(self) -> Cow<'a, str> {
        match self {
            Val::Null => Cow::Borrowed(""),
            Val::Text(s) => Cow::Borrowed(s),
            other => Cow::Owned(other.canon()),
        }
    }

    /// Append the canonical text to `out` (no intermediate allocation for
    /// the common storage classes).
    pub fn write_canon(self, out: &mut String) {
        match self {
            Val::Null => {}
            Val::Int(i) => out.push_str(itoa::Buffer::new().format(i)),
            Val::Text(s) => out.push_str(s),
            // A whole real below 9e15 is its integer's text
            // (`exact_integer_text`), without the allocation.
            Val::Real(f) if f.is_finite() && f.fract() == 0.0 && f.abs() < 9.0e15 => {
                out.push_str(itoa::Buffer::new().format(f as i64))
            }
            other => out.push_str(&other.canon()),
        }
    }

    /// Python's `str(value)`, used where the seed formats a value with an
    /// f-string or `str()` rather than `_canon` (e.g. `pid-<pid>`).
    pub fn py_str(self) -> String {
        match self {
            Val::Null => "None".to_string(),
            Val::Bool(b) => if b { "True" } else { "False" }.to_string(),
            Val::Int(i) => i.to_string(),
            Val::Real(f) => float_repr(f),
            Val::Text(s) => s.to_string(),
            Val::Blob(b) => bytes_repr(b),
        }
    }

    /// Python truthiness.
    pub fn truthy(self) -> bool {
        match self {
            Val::Null => false,
            Val::Bool(b) => b,
            Val::Int(i) => i != 0,
            Val::Real(f) => f != 0.0,
            Val::Text(s) => !s.is_empty(),
            Val::Blob(b) => !b.is_empty(),
        }
    }

    /// `str(value or "")`: the empty string for a falsy value, else `str()`.
    pub fn or_empty_str(self) -> String {
        if self.truthy() {
            self.py_str()
        } else {
            String::new()
        }
    }

    /// `or_empty_str`, borrowed when the value is text or falsy.
    pub fn or_empty_cow(self) -> Cow<'a, str> {
        match self {
            Val::Text(s) => Cow::Borrowed(s),
            v if !v.truthy() => Cow::Borrowed(""),
            other => Cow::Owned(other.py_str()),
        }
    }

    /// `(value or "").strip()` for text; other present values are rendered
    /// with `str()` first (the seed only ever stores text in these columns).
    pub fn stripped(self) -> String {
        self.stripped_cow().into_owned()
    }

    /// `stripped`, borrowed when the value is text.
    pub fn stripped_cow(self) -> Cow<'a, str> {
        match self {
            Val::Text(s) => Cow::Borrowed(py_strip(s)),
            other => Cow::Owned(py_strip(&other.or_empty_str()).to_string()),
        }
    }

    /// A required field is missing: NULL, or text that is empty once
    /// Python's whitespace is stripped.
    pub fn is_blank(self) -> bool {
        match self {
            Val::Null => true,
            // Blank means every character is Python white space: a first
            // character that is not settles it without scanning the rest.
            Val::Text(s) => s.chars().next().is_none_or(is_py_space) && py_strip(s).is_empty(),
            _ => false,
        }
    }

    /// The text, when this value is text.
    pub fn as_text(self) -> Option<&'a str> {
        match self {
            Val::Text(s) => Some(s),
            _ => None,
        }
    }

    /// Render as JSON, keeping the storage class (`900.0` stays a real).
    pub fn to_json(self) -> Json {
        match self {
            Val::Null => Json::Null,
            Val::Bool(b) => Json::Bool(b),
            Val::Int(i) => Json::from(i),
            Val::Real(f) => serde_json::Number::from_f64(f)
                .map(Json::Number)
                .unwrap_or_else(|| Json::String(float_repr(f))),
            Val::Text(s) => Json::String(s.to_string()),
            Val::Blob(b) => Json::String(bytes_repr(b)),
        }
    }
}

impl PartialEq<Value> for Val<'_> {
    fn eq(&self, other: &Value) -> bool {
        *self == other.as_val()
    }
}

impl serde::Serialize for Val<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match *self {
            Val::Null => s.serialize_none(),
            Val::Bool(b) => s.serialize_bool(b),
            Val::Int(i) => s.serialize_i64(i),
            Val::Real(f) if f.is_finite() => s.serialize_f64(f),
            Val::Real(f) => s.serialize_str(&float_repr(f)),
            Val::Text(t) => s.serialize_str(t),
            Val::Blob(b) => s.serialize_str(&bytes_repr(b)),
        }
    }
}

impl Value {
    /// This value, borrowed.
    pub fn as_val(&self) -> Val<'_> {
        match self {
            Value::Null => Val::Null,
            Value::Int(i) => Val::Int(*i),
            Value::Real(f) => Val::Real(*f),
            Value::Text(s) => Val::Text(s.as_str()),
            Value::Bool(b) => Val::Bool(*b),
            Value::Blob(b) => Val::Blob(b),
        }
    }

    /// The storage class, as a word.
    pub fn kind(&self) -> &'static str {
        self.as_val().kind()
    }

    /// [`Val::canon`].
    pub fn canon(&self) -> String {
        self.as_val().canon()
    }

    /// [`Val::canon_cow`].
    pub fn canon_cow(&self) -> Cow<'_, str> {
        self.as_val().canon_cow()
    }

    /// [`Val::write_canon`].
    pub fn write_canon(&self, out: &mut String) {
        self.as_val().write_canon(out)
    }

    /// [`Val::py_str`].
    pub fn py_str(&self) -> String {
        self.as_val().py_str()
    }

    /// [`Val::truthy`].
    pub fn truthy(&self) -> bool {
        self.as_val().truthy()
    }

    /// [`Val::or_empty_str`].
    pub fn or_empty_str(&self) -> String {
        self.as_val().or_empty_str()
    }

    /// [`Val::or_empty_cow`].
    pub fn or_empty_cow(&self) -> Cow<'_, str> {
        self.as_val().or_empty_cow()
    }

    /// [`Val::stripped`].
    pub fn stripped(&self) -> String {
        self.as_val().stripped()
    }

    /// [`Val::stripped_cow`].
    pub fn stripped_cow(&self) -> Cow<'_, str> {
        self.as_val().stripped_cow()
    }

    /// [`Val::is_blank`].
    pub fn is_blank(&self) -> bool {
        self.as_val().is_blank()
    }

    /// [`Val::as_text`].
    pub fn as_text(&self) -> Option<&str> {
        self.as_val().as_text()
    }

    /// Convert a JSON value (fixtures, saved plans). Nested arrays and objects
    /// are not registry values and are refused.
    pub fn from_json(v: &Json) -> Result<Value, String> {
        Ok(match v {
            Json::Null => Value::Null,
            Json::Bool(b) => Value::Bool(*b),
            Json::Number(n) => {
                if let Some(i) = n.as_i64() {
                    Value::Int(i)
                } else if n.is_u64() {
                    return Err(format!("integer {n} does not fit in 64 bits"));
                } else {
                    Value::Real(
                        n.as_f64()
                            .ok_or_else(|| format!("number {n} is out of range"))?,
                    )
                }
            }
            Json::String(s) => Value::Text(s.as_str().into()),
            Json::Array(_) | Json::Object(_) => {
                return Err("expected null, a boolean, a number or a string".to_string())
            }
        })
    }

    /// [`Val::to_json`].
    pub fn to_json(&self) -> Json {
        self.as_val().to_json()
    }
}

/// A text value: a slice of a shared buffer. The registry reader puts all
/// the texts of a batch of rows into one buffer, so a large registry costs
/// one allocation per batch rather than one per value; a text made on its
/// own (`From<&str>`) has a buffer of its own. Sixteen bytes, like the
/// `Arc<str>` it replaces.
#[derive(Clone)]
pub struct Text {
    buf: std::sync::Arc<TextBuf>,
    start: u32,
    len: u32,
}

/// The buffer texts are sliced from.
#[derive(Debug)]
pub struct TextBuf(Box<str>);

impl TextBuf {
    /// A buffer holding `text`, to slice texts from with [`Text::slice`].
    pub fn new(text: String) -> std::sync::Arc<TextBuf> {
        std::sync::Arc::new(TextBuf(text.into_boxed_str()))
    }

    /// The whole buffer.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Text {
    /// The text `buf[range]`; `None` when the range is not within the buffer
    /// on character boundaries, or is 4 GiB or longer.
    pub fn slice(buf: &std::sync::Arc<TextBuf>, range: std::ops::Range<usize>) -> Option<Text> {
        buf.0.get(range.clone())?;
        Some(Text {
            buf: buf.clone(),
            start: u32::try_from(range.start).ok()?,
            len: u32::try_from(range.len()).ok()?,
        })
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        let start = self.start as usize;
        let range = start..start + self.len as usize;
        debug_assert!(self.buf.0.get(range.clone()).is_some());
        // SAFETY: a `Text` is made only by `slice`, which checked that this
        // range lies within the buffer on character boundaries, and the
        // buffer (a `Box<str>` behind an `Arc`) never changes. Every text
        // the program touches comes through here, so the check is not
        // repeated on every access.
        unsafe { self.buf.0.get_unchecked(range) }
    }
}

impl From<&str> for Text {
    fn from(s: &str) -> Text {
        Text::from(s.to_string())
    }
}

impl From<String> for Text {
    fn from(s: String) -> Text {
        let len = s.len();
        let buf = TextBuf::new(s);
        // No input we read holds a single value of 4 GiB (SQLite's own limit
        // is 1 GB; JSON inputs are bounded far below).
        Text::slice(&buf, 0..len).expect("a text value shorter than 4 GiB")
    }
}

impl std::ops::Deref for Text {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for Text {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl std::borrow::Borrow<str> for Text {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl PartialEq for Text {
    fn eq(&self, other: &Text) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Text {}

impl std::hash::Hash for Text {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.as_str().hash(h)
    }
}

impl std::fmt::Debug for Text {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

impl std::fmt::Display for Text {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for Value {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.as_val().serialize(s)
    }
}

/// Python's whitespace for `str.strip()`: Unicode White_Space plus the
/// information separators U+001C..U+001F.
pub fn is_py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `str.strip()` with no argument.
pub fn py_strip(s: &str) -> &str {
    s.trim_matches(is_py_space)
}

/// Python's `repr(float)`: shortest round-trip digits, exponent form when
/// the decimal exponent is below -4 or at least 16.
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".to_string();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.to_string();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.to_string();
    }
    // Rust's `{:e}` gives the shortest round-trip digits, e.g. "-1.5e16".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').expect("{:e} always has an exponent");
    let exp: i32 = exp.parse().expect("{:e} exponent is an integer");
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if !(-4..16).contains(&exp) {
        let mut out = format!("{sign}{}", &digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let esign = if exp < 0 { '-' } else { '+' };
        out.push_str(&format!("e{esign}{:02}", exp.abs()));
        return out;
    }
    if exp < 0 {
        let zeros = "0".repeat((-exp - 1) as usize);
        return format!("{sign}0.{zeros}{digits}");
    }
    let point = exp as usize + 1;
    if digits.len() <= point {
        let zeros = "0".repeat(point - digits.len());
        format!("{sign}{digits}{zeros}.0")
    } else {
        format!("{sign}{}.{}", &digits[..point], &digits[point..])
    }
}

/// The exact decimal integer of an integral, finite float (`str(int(f))`).
pub fn exact_integer_text(f: f64) -> String {
    if f.abs() < 9.0e15 {
        return format!("{}", f as i64);
    }
    let bits = f.to_bits();
    let negative = bits >> 63 == 1;
    let exponent = ((bits >> 52) & 0x7ff) as i32 - 1075;
    let mantissa = (bits & ((1u64 << 52) - 1)) | (1u64 << 52);
    // |f| >= 9e15 > 2^52, so the exponent is non-negative: f = mantissa * 2^exponent.
    // Little-endian base-1e9 limbs.
    let mut limbs: Vec<u64> = vec![mantissa % 1_000_000_000, mantissa / 1_000_000_000];
    for _ in 0..exponent.max(0) {
        let mut carry = 0u64;
        for limb in limbs.iter_mut() {
            let v = *limb * 2 + carry;
            *limb = v % 1_000_000_000;
            carry = v / 1_000_000_000;
        }
        if carry > 0 {
            limbs.push(carry);
        }
    }
    while limbs.len() > 1 && *limbs.last().unwrap_or(&1) == 0 {
        limbs.pop();
    }
    let mut out = String::new();
    if negative {
        out.push('-');
    }
    let mut iter = limbs.iter().rev();
    if let Some(first) = iter.next() {
        out.push_str(&first.to_string());
    }
    for limb in iter {
        out.push_str(&format!("{limb:09}"));
    }
    out
}

/// Python's `repr(bytes)`.
fn bytes_repr(b: &[u8]) -> String {
    let quote = if b.contains(&b'\'') && !b.contains(&b'"') {
        '"'
    } else {
        '\''
    };
    let mut out = format!("b{quote}");
    for &c in b {
        match c {
            b'\\' => out.push_str("\\\\"),
            b'\t' => out.push_str("\\t"),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            c if c as char == quote => {
                out.push('\\');
                out.push(quote)
            }
            0x20..=0x7e => out.push(c as char),
            _ => out.push_str(&format!("\\x{c:02x}")),
        }
    }
    out.push(quote);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_canon_writes_canon() {
        let reals = [
            0.0,
            -0.0,
            900.0,
            -900.0,
            0.5,
            1e-5,
            8.999_999_999_999_998e15,
            9.0e15,
            -9.0e15,
            1e16,
            1.5e16,
            2f64.powi(60),
            f64::MAX,
            f64::MIN_POSITIVE,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ];
        let values = reals.iter().map(|f| Value::Real(*f)).chain([
            Value::Null,
            Value::Int(i64::MIN),
            Value::Int(0),
            Value::Text("t\u{1f}x".into()),
            Value::Bool(true),
            Value::Blob(vec![0, 255].into()),
        ]);
        for v in values {
            let mut out = String::from("prefix");
            v.write_canon(&mut out);
            assert_eq!(out, format!("prefix{}", v.canon()), "{v:?}");
        }
    }

    #[test]
    fn float_repr_matches_python() {
        // Expected strings are Python 3's repr() of the same floats.
        let cases = [
            (900.5, "900.5"),
            (0.25, "0.25"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1.5e16, "1.5e+16"),
            (1e16, "1e+16"),
            (123456789012345.6, "123456789012345.6"),
            (-2.5e-7, "-2.5e-07"),
            (900.0, "900.0"),
            (1e15, "1000000000000000.0"),
            (0.1, "0.1"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
        ];
        for (f, want) in cases {
            assert_eq!(float_repr(f), want, "repr({f})");
        }
    }

    #[test]
    fn canon_of_integral_reals_is_the_exact_integer() {
        assert_eq!(Value::Real(900.0).canon(), "900");
        assert_eq!(Value::Real(-0.0).canon(), "0");
        assert_eq!(Value::Real(1e23).canon(), "99999999999999991611392");
        assert_eq!(Value::Real(2f64.powi(70)).canon(), "1180591620717411303424");
        assert_eq!(Value::Real(-1e16).canon(), "-10000000000000000");
        assert_eq!(Value::Real(900.5).canon(), "900.5");
        assert_eq!(Value::Real(f64::INFINITY).canon(), "inf");
    }

    #[test]
    fn canon_and_str_differ_where_python_does() {
        assert_eq!(Value::Bool(true).canon(), "true");
        assert_eq!(Value::Bool(true).py_str(), "True");
        assert_eq!(Value::Real(4242.0).py_str(), "4242.0");
        assert_eq!(Value::Null.canon(), "");
        assert_eq!(Value::Blob(b"a'".to_vec().into()).canon(), "b\"a'\"");
    }

    #[test]
    fn blank_uses_pythons_whitespace() {
        assert!(Value::Null.is_blank());
        assert!(Value::Text("".into()).is_blank());
        assert!(Value::Text(" \t\u{a0}\u{1f}\u{3000}".into()).is_blank());
        assert!(!Value::Text("\u{200b}".into()).is_blank());
        assert!(!Value::Int(0).is_blank());
    }
}
