//! The one scanner that finds secrets in a captured text value.
//!
//! Every text a capture writes out of the registry or lease store passes
//! through [`Scrubber::scrub`]. It looks for four kinds of secret anywhere in
//! the value, as many times as they occur:
//!
//! * the user part of a URL (`scheme://user:password@host`), also when the
//!   password holds `/`, `?` or `#` (which a strict URL parser would take for
//!   the start of the path, leaving the password in place);
//! * the credential after an HTTP authorization scheme or a secret-named key:
//!   `Bearer X`, `token X`, `Basic X`, `password=X`, `secret: X`, `apikey=X`;
//! * the tokens of the common forges, chat services and clouds, known by their
//!   prefix (GitHub, GitLab, Slack, AWS, Google, OpenAI, Anthropic, Stripe,
//!   npm, PyPI, Hugging Face) and JSON Web Tokens;
//! * PEM private key blocks.
//!
//! Each secret found is replaced by a placeholder `redacted-N`, the same
//! secret by the same placeholder wherever it occurs, so rows that shared a
//! value still share one and the captured case keeps its verdicts. A scanner
//! cannot know every secret: an opaque password with no marker around it
//! (`bot:hunter2` outside a URL) looks like any other text. Such values
//! belong in a column named for a secret, which is replaced whole.

use std::collections::HashMap;
use std::ops::Range;

/// Replaces secrets by placeholders, the same secret by the same one.
#[derive(Debug, Default)]
pub struct Scrubber {
    seen: HashMap<String, String>,
}

impl Scrubber {
    /// `text` with every secret found replaced, or `None` when it holds none.
    pub fn scrub(&mut self, text: &str) -> Option<String> {
        let spans = secret_spans(text);
        if spans.is_empty() {
            return None;
        }
        let mut out = String::with_capacity(text.len());
        let mut at = 0;
        for span in spans {
            out.push_str(&text[at..span.start]);
            out.push_str(&self.placeholder(&text[span.clone()], "redacted"));
            at = span.end;
        }
        out.push_str(&text[at..]);
        Some(out)
    }

    /// The placeholder of a whole secret value: `<label>-N`, N counting the
    /// distinct secrets seen so far.
    pub fn placeholder(&mut self, secret: &str, label: &str) -> String {
        let n = self.seen.len() + 1;
        self.seen
            .entry(secret.to_string())
            .or_insert_with(|| format!("{label}-{n}"))
            .clone()
    }
}

/// Where the secrets of `text` are: sorted, overlapping finds merged.
pub fn secret_spans(text: &str) -> Vec<Range<usize>> {
    let userinfo = url_userinfo(text);
    // A credential named inside a URL's user part (`https://x-token:T@host`)
    // ends with that user part: the host after it is no secret.
    let named = named_credentials(text).into_iter().map(|s| {
        match userinfo.iter().find(|u| u.contains(&s.start)) {
            Some(u) => s.start..s.end.min(u.end),
            None => s,
        }
    });
    let mut spans: Vec<Range<usize>> = named.collect();
    spans.extend(userinfo.iter().cloned());
    spans.extend(prefixed_tokens(text));
    spans.extend(json_web_tokens(text));
    spans.extend(private_keys(text));
    spans.retain(|s| !s.is_empty());
    spans.sort_by_key(|s| (s.start, s.end));
    let mut merged: Vec<Range<usize>> = Vec::new();
    for span in spans {
        match merged.last_mut() {
            Some(last) if span.start < last.end => last.end = last.end.max(span.end),
            _ => merged.push(span),
        }
    }
    merged
}

/// Whether `c` ends a URL or a credential written in running text.
fn ends_word(c: char) -> bool {
    c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>' | '`')
}

/// The end of the word of `text` starting at `from`.
fn word_end(text: &str, from: usize) -> usize {
    text[from..]
        .find(ends_word)
        .map_or(text.len(), |i| from + i)
}

/// Whether byte `at` of `text` starts a word: the text starts there or the
/// character before is not a letter or digit.
fn starts_word(text: &str, at: usize) -> bool {
    text[..at]
        .chars()
        .next_back()
        .is_none_or(|c| !c.is_alphanumeric())
}

/// The user part of every URL: after `://`, up to the last `@` of the
/// authority. When the authority has no `@` but holds a `:` that is not a
/// port (`https://user:pa/ss@host`), the password ran into the path, and the
/// user part is taken up to the word's last `@`.
fn url_userinfo(text: &str) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    for (i, _) in text.match_indices("://") {
        let start = i + 3;
        let end = word_end(text, start);
        let word = &text[start..end];
        let authority = &word[..word.find(['/', '?', '#', '\\']).unwrap_or(word.len())];
        let userinfo_end = match authority.rfind('@') {
            Some(at) => Some(at),
            None => authority
                .rsplit_once(':')
                .filter(|(_, after)| !is_port(after))
                .and_then(|_| word.rfind('@')),
        };
        if let Some(at) = userinfo_end {
            out.push(start..start + at);
        }
    }
    out
}

/// Whether the text after a host's `:` is a port number.
fn is_port(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

/// Words after which the next word is a credential, and whether they need
/// `=` or `:` before it (an authorization scheme is followed by a space).
const CREDENTIAL_WORDS: &[(&str, bool)] = &[
    ("bearer", false),
    ("token", false),
    ("basic", false),
    ("password", true),
    ("passwd", true),
    ("secret", true),
    ("apikey", true),
    ("api_key", true),
    ("api-key", true),
];

/// The credential after `Bearer`, `token`, `Basic` (any case, then spaces,
/// `=` or `:`), and after a secret-named key and `=` or `:`.
fn named_credentials(text: &str) -> Vec<Range<usize>> {
    let lower = text.to_ascii_lowercase();
    let mut out = Vec::new();
    for (word, needs_assignment) in CREDENTIAL_WORDS {
        for (i, _) in lower.match_indices(word) {
            if !starts_word(text, i) {
                continue;
            }
            let after = i + word.len();
            let gap = text[after..]
                .find(|c: char| !matches!(c, ' ' | '\t' | '=' | ':'))
                .map_or(text.len() - after, |g| g);
            let separator = &text[after..after + gap];
            let assigned = separator.contains(['=', ':']);
            if separator.is_empty() || (*needs_assignment && !assigned) {
                continue;
            }
            let start = after + gap;
            let end = text[start..]
                .find(|c: char| ends_word(c) || matches!(c, ',' | ';'))
                .map_or(text.len(), |e| start + e);
            out.push(start..end);
        }
    }
    out
}

/// A token known by its prefix: the prefix, the characters its body may
/// hold, and the fewest of them that make it a token rather than a word.
struct Prefix {
    prefix: &'static str,
    body: fn(u8) -> bool,
    min_body: usize,
}

fn token_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

fn upper_or_digit(b: u8) -> bool {
    b.is_ascii_uppercase() || b.is_ascii_digit()
}

const fn prefix(prefix: &'static str, min_body: usize) -> Prefix {
    Prefix {
        prefix,
        body: token_char,
        min_body,
    }
}

/// The token prefixes looked for, with the shortest body each needs.
const PREFIXES: &[Prefix] = &[
    // GitHub: personal, OAuth, server-to-server, user-to-server, refresh,
    // fine-grained personal.
    prefix("ghp_", 1),
    prefix("gho_", 1),
    prefix("ghs_", 1),
    prefix("ghu_", 1),
    prefix("ghr_", 1),
    prefix("github_pat_", 1),
    // GitLab: personal, deploy, runner, pipeline trigger, CI job, feed.
    prefix("glpat-", 1),
    prefix("gldt-", 1),
    prefix("glrt-", 1),
    prefix("glptt-", 1),
    prefix("glcbt-", 1),
    prefix("glft-", 1),
    // Slack: bot, user, app-level, refresh, configuration, legacy.
    prefix("xoxb-", 1),
    prefix("xoxp-", 1),
    prefix("xoxa-", 1),
    prefix("xoxr-", 1),
    prefix("xoxe-", 1),
    prefix("xoxs-", 1),
    prefix("xoxo-", 1),
    prefix("xapp-", 1),
    // AWS access key ids (long-term and temporary): 16 upper-case letters
    // or digits after the prefix.
    Prefix {
        prefix: "AKIA",
        body: upper_or_digit,
        min_body: 12,
    },
    Prefix {
        prefix: "ASIA",
        body: upper_or_digit,
        min_body: 12,
    },
    // Google API keys.
    prefix("AIza", 30),
    // OpenAI and Anthropic API keys.
    prefix("sk-ant-", 1),
    prefix("sk-proj-", 1),
    prefix("sk-", 20),
    // Stripe secret and restricted keys.
    prefix("sk_live_", 1),
    prefix("sk_test_", 1),
    prefix("rk_live_", 1),
    // npm, PyPI, Hugging Face.
    prefix("npm_", 16),
    prefix("pypi-", 16),
    prefix("hf_", 16),
];

/// Every token of [`PREFIXES`] starting a word, prefix and body.
fn prefixed_tokens(text: &str) -> Vec<Range<usize>> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    for p in PREFIXES {
        for (i, _) in text.match_indices(p.prefix) {
            if !starts_word(text, i) {
                continue;
            }
            let body = i + p.prefix.len();
            let end = bytes[body..]
                .iter()
                .position(|&b| !(p.body)(b))
                .map_or(bytes.len(), |e| body + e);
            if end - body >= p.min_body {
                out.push(i..end);
            }
        }
    }
    out
}

/// JSON Web Tokens: `eyJ…` header, `.`, payload, `.`, signature.
fn json_web_tokens(text: &str) -> Vec<Range<usize>> {
    let bytes = text.as_bytes();
    let part_end = |from: usize| {
        bytes[from..]
            .iter()
            .position(|&b| !token_char(b))
            .map_or(bytes.len(), |e| from + e)
    };
    let mut out = Vec::new();
    for (i, _) in text.match_indices("eyJ") {
        if !starts_word(text, i) {
            continue;
        }
        let header = part_end(i);
        if header - i < 10 || bytes.get(header) != Some(&b'.') {
            continue;
        }
        let payload = part_end(header + 1);
        if payload == header + 1 || bytes.get(payload) != Some(&b'.') {
            continue;
        }
        out.push(i..part_end(payload + 1));
    }
    out
}

/// PEM private key blocks, `-----BEGIN … PRIVATE KEY-----` to the end of
/// the matching `-----END …-----` line (or of the text, when cut short).
fn private_keys(text: &str) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    for (i, _) in text.match_indices("-----BEGIN ") {
        let Some(line_end) = text[i + 11..].find("-----").map(|e| i + 11 + e) else {
            continue;
        };
        if !text[i..line_end].ends_with("PRIVATE KEY") {
            continue;
        }
        let end = text[line_end + 5..]
            .find("-----END ")
            .and_then(|e| {
                let from = line_end + 5 + e + 9;
                text[from..].find("-----").map(|f| from + f + 5)
            })
            .unwrap_or(text.len());
        out.push(i..end);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrub(text: &str) -> String {
        Scrubber::default()
            .scrub(text)
            .unwrap_or_else(|| text.to_string())
    }

    #[test]
    fn url_credentials_are_replaced() {
        assert_eq!(
            scrub("https://bot:s3cret@git.example/prgs/x"),
            "https://redacted-1@git.example/prgs/x"
        );
        assert_eq!(
            scrub("ssh://ghp@git.example"),
            "ssh://redacted-1@git.example"
        );
        // A password holding `@`: the authority ends at the last one.
        assert_eq!(scrub("https://u:p@ss@h/x"), "https://redacted-1@h/x");
        // No user part: untouched.
        assert_eq!(Scrubber::default().scrub("https://git.example/a@b"), None);
        assert_eq!(
            Scrubber::default().scrub("https://git.example:8443/a@b"),
            None
        );
        assert_eq!(Scrubber::default().scrub("prgs"), None);
    }

    #[test]
    fn a_password_holding_a_slash_is_replaced_whole() {
        assert_eq!(scrub("https://s:EEEE/secret5@h"), "https://redacted-1@h");
        assert_eq!(scrub("https://s:a?b#c@h/p"), "https://redacted-1@h/p");
    }

    #[test]
    fn every_url_of_a_value_loses_its_credentials() {
        assert_eq!(
            scrub("https://a:one@h1/x https://b:two@h2/y,https://c:three@h3"),
            "https://redacted-1@h1/x https://redacted-2@h2/y,https://redacted-3@h3"
        );
    }

    #[test]
    fn authorization_scheme_credentials_are_replaced() {
        assert_eq!(scrub("Bearer abc.def"), "Bearer redacted-1");
        assert_eq!(
            scrub("Authorization: token abc123; x"),
            "Authorization: token redacted-1; x"
        );
        assert_eq!(scrub("basic dXNlcjpwYXNz"), "basic redacted-1");
        assert_eq!(scrub("BEARER=xyz"), "BEARER=redacted-1");
        // The word alone, or inside another word, is not a credential.
        assert_eq!(Scrubber::default().scrub("w-token-1"), None);
        assert_eq!(Scrubber::default().scrub("tokens expire"), None);
        assert_eq!(Scrubber::default().scrub("a bearer"), None);
    }

    #[test]
    fn secret_named_keys_lose_their_values() {
        assert_eq!(scrub("password=hunter2&x=1"), "password=redacted-1");
        assert_eq!(scrub("client_secret: abc"), "client_secret: redacted-1");
        assert_eq!(scrub("API_KEY=k1"), "API_KEY=redacted-1");
        // A secret-named word followed by a space is prose, not a key.
        assert_eq!(Scrubber::default().scrub("password expired"), None);
    }

    #[test]
    fn github_tokens_are_replaced() {
        for t in [
            "ghp_AAAA1111",
            "gho_BBBB",
            "ghs_CCCC",
            "ghu_DDDD",
            "ghr_EEEE",
            "github_pat_11ABC_def",
        ] {
            assert_eq!(scrub(&format!("bot:{t} x")), "bot:redacted-1 x", "{t}");
        }
    }

    #[test]
    fn gitlab_tokens_are_replaced() {
        for t in [
            "glpat-CCCC3333",
            "gldt-x",
            "glrt-x",
            "glptt-x",
            "glcbt-x",
            "glft-x",
        ] {
            assert_eq!(scrub(t), "redacted-1", "{t}");
        }
    }

    #[test]
    fn slack_tokens_are_replaced() {
        for t in [
            "xoxb-1234-DDDD",
            "xoxp-1-2",
            "xoxa-2",
            "xoxr-3",
            "xoxe-4",
            "xoxs-5",
            "xapp-1-A",
        ] {
            assert_eq!(scrub(t), "redacted-1", "{t}");
        }
    }

    #[test]
    fn aws_access_key_ids_are_replaced() {
        assert_eq!(scrub("id AKIAIOSFODNN7EXAMPLE"), "id redacted-1");
        assert_eq!(scrub("ASIAY34FZKBOKMUTVV7A"), "redacted-1");
        // Too short to be a key id.
        assert_eq!(Scrubber::default().scrub("AKIA-1"), None);
    }

    #[test]
    fn other_cloud_and_registry_keys_are_replaced() {
        for t in [
            "AIzaSyA1234567890abcdefghijklmnopqrstu",
            "sk-ant-api03-abc",
            "sk-proj-abc",
            "sk-abcdefghijklmnopqrstuvwxyz",
            "sk_live_abc",
            "rk_live_abc",
            "npm_abcdefghijklmnopqrstuvwxyz",
            "pypi-AgEIcHlwaS5vcmcCJDAw",
            "hf_abcdefghijklmnopqrst",
        ] {
            assert_eq!(scrub(t), "redacted-1", "{t}");
        }
        // A word that merely starts like one is kept.
        assert_eq!(Scrubber::default().scrub("sk-1 unghp_x"), None);
    }

    #[test]
    fn json_web_tokens_are_replaced() {
        assert_eq!(
            scrub("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl end"),
            "jwt redacted-1 end"
        );
    }

    #[test]
    fn private_key_blocks_are_replaced() {
        assert_eq!(
            scrub("k=-----BEGIN RSA PRIVATE KEY-----\nMIIB\n-----END RSA PRIVATE KEY----- tail"),
            "k=redacted-1 tail"
        );
        assert_eq!(scrub("-----BEGIN PRIVATE KEY-----\nMIIB"), "redacted-1");
        assert_eq!(
            Scrubber::default().scrub("-----BEGIN CERTIFICATE-----\nMIIB"),
            None
        );
    }

    #[test]
    fn one_secret_gets_one_placeholder_everywhere() {
        let mut s = Scrubber::default();
        assert_eq!(s.scrub("Bearer ghp_A").unwrap(), "Bearer redacted-1");
        assert_eq!(s.scrub("https://ghp_A@h").unwrap(), "https://redacted-1@h");
        assert_eq!(s.scrub("ghp_B").unwrap(), "redacted-2");
        assert_eq!(
            s.placeholder("tok", "redacted-token_fingerprint"),
            "redacted-token_fingerprint-3"
        );
    }

    #[test]
    fn a_credential_named_in_a_url_keeps_the_host() {
        assert_eq!(
            scrub("https://x-access-token:ghs_A@github.com/o/r"),
            "https://redacted-1@github.com/o/r"
        );
    }

    #[test]
    fn text_around_secrets_keeps_its_characters() {
        assert_eq!(scrub("é https://ü:ghp_x@hé ✓"), "é https://redacted-1@hé ✓");
    }
}
