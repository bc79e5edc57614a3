//! Reading the JSON files an operator hands us (`profiles.json`, saved
//! plans) strictly: a bounded size, a regular file only (a FIFO or a device
//! is refused instead of blocking or reading forever), no byte-order mark,
//! and no duplicate keys (serde_json would silently keep the last one, so a
//! grant followed by a read-only duplicate would read differently to a
//! person and to the program). The policy folder's files are read through
//! the same bounded, non-blocking open, refusing a symbolic link as well.

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value as Json};
use sha2::{Digest, Sha256};
use std::fmt;
use std::io::Read;
use std::path::Path;

/// The largest JSON input we read (16 MiB). A plan of 100,000 candidates'
/// identities fits many times over.
pub const MAX_INPUT_BYTES: u64 = 16 << 20;

/// A file's bytes and their sha256.
#[derive(Debug, Clone)]
pub struct FileBytes {
    /// The content.
    pub text: String,
    /// `sha256:<hex>` of the content.
    pub sha256: String,
}

/// Read a regular file without ever blocking on it: it is opened
/// non-blocking and must be a regular file of at most `limit` bytes.
pub fn read_regular(path: &Path, limit: u64) -> Result<FileBytes, String> {
    read_bounded(path, limit, Links::Follow)
}

/// [`read_regular`] for a file that must be in its folder itself: a
/// symbolic link in its place is refused, never followed (`O_NOFOLLOW`),
/// so a link to `/etc/shadow` or `/proc/self/environ` is not read.
pub fn read_regular_in_place(path: &Path, limit: u64) -> Result<FileBytes, String> {
    read_bounded(path, limit, Links::Refuse)
}

/// Whether a symbolic link at the path itself is followed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Links {
    Follow,
    Refuse,
}

fn read_bounded(path: &Path, limit: u64, links: Links) -> Result<FileBytes, String> {
    let (file, meta) = open_regular(path, links)?;
    let mut bytes = Vec::with_capacity(meta.len().min(limit) as usize);
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read ({e})"))?;
    if bytes.len() as u64 > limit {
        return Err(format!(
            "is larger than {limit} bytes; this is not a file fleet-retire writes or expects"
        ));
    }
    let sha256 = format!(
        "sha256:{}",
        crate::fingerprint::hex(&Sha256::digest(&bytes))
    );
    let text = String::from_utf8(bytes).map_err(|e| {
        format!(
            "is not UTF-8 text (invalid byte at offset {})",
            e.utf8_error().valid_up_to()
        )
    })?;
    Ok(FileBytes { text, sha256 })
}

/// Open a file without ever blocking on it (non-blocking open), refusing
/// anything but a regular file.
fn open_regular(path: &Path, links: Links) -> Result<(std::fs::File, std::fs::Metadata), String> {
    use nix::fcntl::OFlag;
    use std::os::unix::fs::OpenOptionsExt;
    let mut flags = OFlag::O_NONBLOCK;
    if links == Links::Refuse {
        flags |= OFlag::O_NOFOLLOW;
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags.bits())
        .open(path)
        .map_err(|e| {
            if links == Links::Refuse && e.raw_os_error() == Some(nix::errno::Errno::ELOOP as i32) {
                "is a symbolic link, which is never followed here; put the file itself in its place"
                    .to_string()
            } else {
                format!("cannot open ({e})")
            }
        })?;
    let meta = file.metadata().map_err(|e| format!("cannot stat ({e})"))?;
    if !meta.is_file() {
        return Err(
            "is not a regular file (a FIFO, device or folder is never read); point at the file itself"
                .into(),
        );
    }
    Ok((file, meta))
}

/// Parse JSON text, refusing a byte-order mark and duplicate object keys.
/// Errors name the line and column, and for duplicates the key's path.
pub fn parse_strict(text: &str) -> Result<Json, String> {
    if text.starts_with('\u{feff}') {
        return Err(
            "starts with a UTF-8 byte-order mark (EF BB BF); save the file as UTF-8 without a BOM"
                .into(),
        );
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let value = Strict { path: "$" }
        .deserialize(&mut de)
        .and_then(|v| de.end().map(|()| v))
        .map_err(|e| describe(&e))?;
    Ok(value)
}

/// The start of the message for a key given twice (`duplicate key "a" at
/// $.profiles.a`), which [`describe`] completes with the position and what
/// to do.
const DUPLICATE_KEY: &str = "duplicate key ";

/// A parse error as a person reads it: where it is, said once (serde_json's
/// own text ends with "at line L column C", which is cut off here), and
/// what to do. A key given twice is valid JSON syntax, so it is not called
/// "not valid JSON"; it names the key's path and asks to keep one of them.
fn describe(e: &serde_json::Error) -> String {
    let (line, column) = (e.line(), e.column());
    let full = e.to_string();
    let said = full
        .strip_suffix(&format!(" at line {line} column {column}"))
        .unwrap_or(&full);
    if said.starts_with(DUPLICATE_KEY) {
        format!(
            "{said} (line {line}, column {column}): a key may appear only once in an object; \
             keep the one you mean and delete the other"
        )
    } else {
        format!("not valid JSON at line {line}, column {column}: {said}")
    }
}

/// Read a regular file of at most [`MAX_INPUT_BYTES`] and parse it strictly.
pub fn read_json(path: &Path) -> Result<(Json, FileBytes), String> {
    let bytes = read_regular(path, MAX_INPUT_BYTES)?;
    let doc = parse_strict(&bytes.text)?;
    Ok((doc, bytes))
}

/// The largest saved plan we stream (64 GiB): a plan of a registry with
/// millions of rows is gigabytes, and is read without being held.
pub const MAX_STREAMED_BYTES: u64 = 64 << 30;

/// Deserialise a parsed document into `T`, naming the member of any error
/// (`expect.preserved.w-1 must be a string, not integer `7``).
pub fn typed<T: de::DeserializeOwned>(doc: Json) -> Result<T, String> {
    serde_path_to_error::deserialize(doc).map_err(|e| {
        let place = e.path().to_string();
        let inner = e.into_inner().to_string();
        if inner.starts_with("unknown field") {
            // The path ends at the unknown member itself; name where it is.
            return match place.rsplit_once('.') {
                Some((parent, _)) => format!("in `{parent}`: {inner}"),
                None => format!("at the top level: {inner}"),
            };
        }
        // serde says "invalid type: integer `7`, expected a string".
        let said = match inner
            .strip_prefix("invalid type: ")
            .and_then(|rest| rest.split_once(", expected "))
        {
            Some((found, wanted)) => format!("must be {wanted}, not {found}"),
            None => inner,
        };
        if place == "." {
            said
        } else {
            format!("field `{place}` {said}")
        }
    })
}

/// Stream a large JSON object from a regular file, keeping only the
/// top-level keys in `keep` (parsed strictly, as [`parse_strict`] does) and
/// `typed` (deserialised straight into `T`), and skipping every other
/// value without holding it. Refuses a byte-order mark, a duplicate
/// top-level key, and anything but an object.
pub fn read_selected<T: de::DeserializeOwned>(
    path: &Path,
    keep: &[&str],
    typed: &str,
) -> Result<(Map<String, Json>, Option<T>), String> {
    use std::io::BufRead;
    let (file, meta) = open_regular(path, Links::Follow)?;
    if meta.len() > MAX_STREAMED_BYTES {
        return Err(format!(
            "is larger than {MAX_STREAMED_BYTES} bytes; this is not a file fleet-retire writes or expects"
        ));
    }
    let mut reader = std::io::BufReader::with_capacity(1 << 20, file.take(MAX_STREAMED_BYTES));
    let head = reader
        .fill_buf()
        .map_err(|e| format!("cannot read ({e})"))?;
    if head.starts_with(b"\xef\xbb\xbf") {
        return Err(
            "starts with a UTF-8 byte-order mark (EF BB BF); save the file as UTF-8 without a BOM"
                .into(),
        );
    }
    let mut de = serde_json::Deserializer::from_reader(reader);
    let parts = Selected::<T> {
        keep,
        typed,
        _t: std::marker::PhantomData,
    }
    .deserialize(&mut de)
    .and_then(|v| de.end().map(|()| v))
    .map_err(|e| {
        if e.is_io() {
            format!("cannot read ({e})")
        } else {
            describe(&e)
        }
    })?;
    Ok(parts)
}

struct Selected<'k, T> {
    keep: &'k [&'k str],
    typed: &'k str,
    _t: std::marker::PhantomData<T>,
}

impl<'de, T: de::DeserializeOwned> DeserializeSeed<'de> for Selected<'_, T> {
    type Value = (Map<String, Json>, Option<T>);
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, T: de::DeserializeOwned> Visitor<'de> for Selected<'_, T> {
    type Value = (Map<String, Json>, Option<T>);

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut kept = Map::new();
        let mut typed = None;
        let mut seen = std::collections::HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                return Err(de::Error::custom(format!(
                    "{DUPLICATE_KEY}{key:?} at $.{key}"
                )));
            }
            if key == self.typed {
                typed = Some(
                    map.next_value::<T>()
                        .map_err(|e| de::Error::custom(format!("`{key}`: {e}")))?,
                );
            } else if self.keep.contains(&key.as_str()) {
                let path = format!("$.{key}");
                let value = map.next_value_seed(Strict { path: &path })?;
                kept.insert(key, value);
            } else {
                map.next_value::<de::IgnoredAny>()?;
            }
        }
        Ok((kept, typed))
    }
}

struct Strict<'p> {
    path: &'p str,
}

impl<'de> DeserializeSeed<'de> for Strict<'_> {
    type Value = Json;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Json, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict<'_> {
    type Value = Json;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Json, E> {
        Ok(Json::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Json, E> {
        Ok(Json::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Json, E> {
        Ok(Json::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Json, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Json::Null, Json::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Json, E> {
        Ok(Json::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Json, E> {
        Ok(Json::String(v))
    }
    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_none<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut out = Vec::new();
        loop {
            let path = format!("{}[{}]", self.path, out.len());
            match seq.next_element_seed(Strict { path: &path })? {
                Some(v) => out.push(v),
                None => return Ok(Json::Array(out)),
            }
        }
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let path = format!("{}.{}", self.path, key);
            if out.contains_key(&key) {
                return Err(de::Error::custom(format!(
                    "{DUPLICATE_KEY}{key:?} at {path}"
                )));
            }
            let value = map.next_value_seed(Strict { path: &path })?;
            out.insert(key, value);
        }
        Ok(Json::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicates_bom_and_trailing_text_are_refused() {
        let e =
            parse_strict(r#"{"profiles": {"a": {"role": "x"}, "a": {"role": "y"}}}"#).unwrap_err();
        assert_eq!(
            e,
            "duplicate key \"a\" at $.profiles.a (line 1, column 37): a key may appear only \
             once in an object; keep the one you mean and delete the other"
        );
        let e = parse_strict("{\"a\": }").unwrap_err();
        assert_eq!(e, "not valid JSON at line 1, column 7: expected value");
        let e = parse_strict("\u{feff}{}").unwrap_err();
        assert!(e.contains("byte-order mark"), "{e}");
        assert!(parse_strict("{} x").is_err());
        let v = parse_strict(r#"{"a": [1, 2.5, "x", null, true, {"b": -3}]}"#).unwrap();
        assert_eq!(v["a"][5]["b"], -3);
        assert_eq!(v["a"][1], 2.5);
    }

    #[test]
    fn only_bounded_regular_files_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let e = read_regular(&fifo, 100).unwrap_err();
        assert!(e.contains("not a regular file"), "{e}");
        let e = read_regular(Path::new("/dev/zero"), 100).unwrap_err();
        assert!(e.contains("not a regular file"), "{e}");
        let big = dir.path().join("big");
        std::fs::write(&big, vec![b' '; 101]).unwrap();
        assert!(read_regular(&big, 100).unwrap_err().contains("larger than"));
        std::fs::write(&big, b"{}").unwrap();
        assert_eq!(read_regular(&big, 100).unwrap().text, "{}");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&big, &link).unwrap();
        assert_eq!(read_regular(&link, 100).unwrap().text, "{}");
        let e = read_regular_in_place(&link, 100).unwrap_err();
        assert!(e.contains("symbolic link"), "{e}");
        assert_eq!(read_regular_in_place(&big, 100).unwrap().text, "{}");
    }
}
