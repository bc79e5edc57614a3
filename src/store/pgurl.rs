//! A PostgreSQL URL, parsed once and shown only masked; a store location's
//! name for messages. Below every other module, since errors name stores.
//!
//! A PostgreSQL URL may carry a password, and a password may hold any
//! character (`postgres://u:SE/CR?ET@host/db` authenticates: the driver
//! takes the userinfo up to the first `@`). Scanning the text for where the
//! password ends is how one leaked; so the URL is parsed by the driver's own
//! parser ([`postgres::Config`]) into a [`PgUrl`], whose `Display` is built
//! from the parsed parts and has no way to print the password or any
//! option. Every message, report, audit row and written file names a store
//! through [`label`] or a `PgUrl`, never through the text it was given.
//!
//! A URL that parses is not yet one that reads as meant: an `@` left raw in
//! the password ends the user part early, and the rest of the password
//! becomes the host, which the masked URL shows; a `&` left raw in
//! `?password=` makes the rest an option, which the driver's error names.
//! So a URL holding more than one `@` is refused, and the driver's errors
//! never quote a name from the URL: a URL that does not parse is never
//! shown, in whole or in part. [`mask_given`] is the net under all of this,
//! for text we did not write (the command-line parser's errors): every URL
//! this process was given is replaced by its [`label`].

use std::fmt;
use std::path::Path;

/// Whether a store location names a PostgreSQL database.
pub fn is_postgres(location: &Path) -> bool {
    location
        .to_str()
        .is_some_and(|s| s.starts_with("postgres://") || s.starts_with("postgresql://"))
}

/// A PostgreSQL URL, parsed; shown only without its password.
#[derive(Clone)]
pub struct PgUrl {
    config: postgres::Config,
    shown: String,
    tls: Tls,
}

/// How a connection is protected, with libpq's names and meanings
/// (`sslmode`, `sslrootcert`, `sslcert`, `sslkey`, in the URL or as
/// `PGSSLMODE`, `PGSSLROOTCERT`, `PGSSLCERT`, `PGSSLKEY`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SslMode {
    /// Plain text.
    Disable,
    /// TLS when the server offers it, the certificate unchecked; plain
    /// text otherwise.
    Prefer,
    /// TLS, the certificate unchecked.
    Require,
    /// TLS, the certificate signed by the roots; any host name.
    VerifyCa,
    /// TLS, the certificate signed by the roots and naming the host.
    VerifyFull,
}

impl SslMode {
    /// libpq's name.
    pub fn name(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    fn from_name(name: &str) -> Option<SslMode> {
        [
            SslMode::Disable,
            SslMode::Prefer,
            SslMode::Require,
            SslMode::VerifyCa,
            SslMode::VerifyFull,
        ]
        .into_iter()
        .find(|m| m.name() == name)
    }

    /// Whether the server's certificate is checked before anything else
    /// (a password among it) is sent.
    pub fn verifies(self) -> bool {
        matches!(self, SslMode::VerifyCa | SslMode::VerifyFull)
    }
}

/// The TLS a URL (or the environment) asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tls {
    /// The mode in force.
    pub mode: SslMode,
    /// Whether the operator named it (URL or `PGSSLMODE`), rather than it
    /// being our default for the hosts.
    pub named: bool,
    /// `sslrootcert`: a file of root certificates, or `system`.
    pub root: Option<String>,
    /// `sslcert`: the client's certificate.
    pub cert: Option<String>,
    /// `sslkey`: the client's key.
    pub key: Option<String>,
    /// Whether every host is this machine (loopback or a Unix socket).
    pub local: bool,
}

/// The URL's TLS parameters, which the driver does not read.
const TLS_KEYS: [(&str, &str); 4] = [
    ("sslmode", "PGSSLMODE"),
    ("sslrootcert", "PGSSLROOTCERT"),
    ("sslcert", "PGSSLCERT"),
    ("sslkey", "PGSSLKEY"),
];

impl PgUrl {
    /// Parse a `postgres://` URL with the driver's parser, the TLS
    /// parameters and their environment variables with ours. The error
    /// never holds the URL's text (the driver's message names what is
    /// wrong).
    pub fn parse(url: &str) -> Result<PgUrl, String> {
        Self::parse_with(url, &|name| std::env::var(name).ok())
    }

    /// As [`PgUrl::parse`], the environment read through `env`.
    pub fn parse_with(url: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<PgUrl, String> {
        if url.matches('@').count() > 1 {
            return Err(
                "the URL holds more than one `@`: the driver ends the user and password at the \
                 first and would read the rest as the host; percent-encode an `@` in the \
                 password or in a value as %40"
                    .into(),
            );
        }
        let (rest, asked) = take_tls_parameters(url)?;
        let mut config: postgres::Config = rest.parse().map_err(driver_error)?;
        let get = |(key, var): (&str, &str)| {
            asked
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
                .or_else(|| env(var).filter(|v| !v.is_empty()))
        };
        // The driver connects to `hostaddr` when one is given, whatever
        // `host` says: each must be this machine for the URL to be local.
        let local = !config.get_hosts().is_empty()
            && config.get_hosts().iter().all(is_local)
            && config
                .get_hostaddrs()
                .iter()
                .all(std::net::IpAddr::is_loopback);
        let named = get(TLS_KEYS[0]);
        let mut mode = match &named {
            Some(name) => SslMode::from_name(name).ok_or_else(|| {
                format!(
                    "sslmode={name:?} is not one of disable, prefer, require, verify-ca, \
                     verify-full"
                )
            })?,
            None if local => SslMode::Prefer,
            None => SslMode::VerifyFull,
        };
        let root = get(TLS_KEYS[1]);
        // libpq: `require` with a root certificate file checks the chain.
        if mode == SslMode::Require && root.is_some() {
            mode = SslMode::VerifyCa;
        }
        config.ssl_mode(match mode {
            SslMode::Disable => postgres::config::SslMode::Disable,
            SslMode::Prefer => postgres::config::SslMode::Prefer,
            _ => postgres::config::SslMode::Require,
        });
        let tls = Tls {
            mode,
            named: named.is_some(),
            root,
            cert: get(TLS_KEYS[2]),
            key: get(TLS_KEYS[3]),
            local,
        };
        let shown = shown(&config);
        Ok(PgUrl { config, shown, tls })
    }

    /// The parsed configuration, password included, for connecting.
    pub fn config(&self) -> &postgres::Config {
        &self.config
    }

    /// The TLS asked for.
    pub fn tls(&self) -> &Tls {
        &self.tls
    }
}

/// The driver's parse error, without any text of the URL: its "unknown
/// option `NAME`" names a key of the query, which is a piece of the
/// password when a `&` in `?password=` was left raw.
fn driver_error(e: postgres::Error) -> String {
    let cause = std::error::Error::source(&e).map_or(String::new(), |c| c.to_string());
    if cause.starts_with("unknown option") {
        return format!(
            "{e}: an option the driver does not read (its name is not shown: a `&` or `=` \
             left raw in a password makes a piece of it one; percent-encode them as %26 and \
             %3D). The driver reads host, hostaddr, port, dbname, user, password, \
             application_name, options, connect_timeout, tcp_user_timeout, keepalives, \
             keepalives_idle, keepalives_interval, keepalives_retries, target_session_attrs, \
             channel_binding and load_balance_hosts; this program sslmode, sslrootcert, \
             sslcert and sslkey"
        );
    }
    if cause.is_empty() {
        e.to_string()
    } else {
        format!("{e}: {cause}")
    }
}

/// `text` with every PostgreSQL URL this process was given (an argument,
/// or `FLEET_RETIRE_REGISTRY` / `FLEET_RETIRE_LEASES`) replaced by its
/// [`label`]: for text this program did not compose, such as the
/// command-line parser's errors, which quote an argument as it was typed.
pub fn mask_given(text: &str) -> String {
    let mut given: Vec<String> = std::env::args_os()
        .chain(
            ["FLEET_RETIRE_REGISTRY", "FLEET_RETIRE_LEASES"]
                .iter()
                .filter_map(std::env::var_os),
        )
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    given.sort_by_key(|a| std::cmp::Reverse(a.len()));
    mask_in(text, &given)
}

/// `text` with each URL among `given` (an argument may be `--flag=URL`)
/// replaced by its [`label`].
fn mask_in(text: &str, given: &[String]) -> String {
    let mut out = text.to_string();
    for arg in given {
        let Some(at) = ["postgres://", "postgresql://"]
            .iter()
            .filter_map(|scheme| arg.find(scheme))
            .min()
        else {
            continue;
        };
        let url = &arg[at..];
        if out.contains(url) {
            out = out.replace(url, &label(Path::new(url)));
        }
    }
    out
}

/// Whether a host is this machine: a Unix socket, `localhost`, or a
/// loopback address.
fn is_local(host: &postgres::config::Host) -> bool {
    match host {
        postgres::config::Host::Unix(_) => true,
        postgres::config::Host::Tcp(name) => {
            name == "localhost"
                || name
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        }
    }
}

/// The URL without its TLS parameters, and those parameters (decoded).
/// The query starts at the first `?` after the last `@` (a password may
/// hold `?`), or after the scheme when there is no `@`.
fn take_tls_parameters(url: &str) -> Result<(String, Vec<(String, String)>), String> {
    let after_at = url.rfind('@').map_or(0, |i| i + 1);
    let Some(q) = url[after_at..].find('?').map(|i| after_at + i) else {
        refuse_hidden_tls_keys(url)?;
        return Ok((url.to_string(), Vec::new()));
    };
    let mut kept = Vec::new();
    let mut tls: Vec<(String, String)> = Vec::new();
    for pair in url[q + 1..].split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if TLS_KEYS.iter().any(|(k, _)| *k == key) {
            // libpq lets the last of two win, a reader the first: neither
            // is taken.
            if tls.iter().any(|(k, _)| k == key) {
                return Err(format!(
                    "the URL gives {key} twice; give it once (a URL made stricter by appending \
                     &{key}=… must replace the earlier value instead)"
                ));
            }
            let value = percent_decode(value)
                .ok_or_else(|| format!("the URL's {key} is not valid percent-encoded UTF-8"))?;
            tls.push((key.to_string(), value));
        } else {
            kept.push(pair);
        }
    }
    let mut rest = url[..q].to_string();
    if !kept.is_empty() {
        rest.push('?');
        rest.push_str(&kept.join("&"));
    }
    refuse_hidden_tls_keys(&rest)?;
    Ok((rest, tls))
}

/// A TLS parameter left in what goes to the driver was not read where the
/// URL's query was taken to start: an `@` or `?` that is not
/// percent-encoded (in a password or a value) moved it. Rather than guess
/// which reading the driver takes, the URL is refused.
fn refuse_hidden_tls_keys(rest: &str) -> Result<(), String> {
    let after_scheme = rest.split_once("://").map_or(rest, |(_, r)| r);
    match TLS_KEYS
        .iter()
        .find(|(k, _)| after_scheme.contains(&format!("{k}=")))
    {
        Some((key, _)) => Err(format!(
            "the URL holds {key}= where it cannot be read as a parameter: an `@` or `?` in the \
             password or in a value moved it; percent-encode them (%40, %3F)"
        )),
        None => Ok(()),
    }
}

/// `%XX` sequences decoded (and `+` left as it is, as libpq does).
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

impl fmt::Display for PgUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

impl fmt::Debug for PgUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PgUrl({})", self.shown)
    }
}

/// `postgres://USER:***@HOST:PORT/DATABASE` from the parsed parts: the
/// password (when there is one) is always `***`, and options are left out.
fn shown(config: &postgres::Config) -> String {
    let mut out = String::from("postgres://");
    if let Some(user) = config.get_user() {
        out.push_str(&escape_part(user));
        if config.get_password().is_some() {
            out.push_str(":***");
        }
        out.push('@');
    }
    let ports = config.get_ports();
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let name = match host {
                postgres::config::Host::Tcp(h) => escape_part(h),
                postgres::config::Host::Unix(p) => escape_part(&p.to_string_lossy()),
            };
            match ports.get(i).or(ports.first()) {
                Some(port) => format!("{name}:{port}"),
                None => name,
            }
        })
        .collect();
    out.push_str(&hosts.join(","));
    if let Some(db) = config.get_dbname() {
        out.push('/');
        out.push_str(&escape_part(db));
    }
    out
}

/// A part of the shown URL with the characters that would change how it
/// reads (`@ : / ? # %`, controls, spaces) percent-encoded.
fn escape_part(part: &str) -> String {
    let mut out = String::with_capacity(part.len());
    for c in part.chars() {
        if c.is_control() || c.is_whitespace() || "@:/?#%".contains(c) {
            let mut buf = [0; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A store location for messages, reports and audit rows: a file's path as
/// it is, or a PostgreSQL URL as [`PgUrl`] shows it. A URL the driver
/// cannot parse is not shown at all.
pub fn label(location: &Path) -> String {
    if !is_postgres(location) {
        return location.display().to_string();
    }
    match PgUrl::parse(&location.to_string_lossy()) {
        Ok(url) => url.to_string(),
        Err(_) => "postgres://(a URL that does not parse; not shown)".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_show_whatever_they_hold() {
        for (url, secret) in [
            (
                "postgres://pwuser:SE/CR?ET@db.example:5433/fleet",
                "SE/CR?ET",
            ),
            ("postgresql://u:hunter2@host/db?sslmode=disable", "hunter2"),
            (
                "postgres://u@host/db?password=s3cret&sslmode=disable",
                "s3cret",
            ),
            ("postgres://u:a%2Fb@host/db", "a/b"),
        ] {
            let shown = label(Path::new(url));
            assert!(!shown.contains(secret), "{url} showed as {shown}");
            assert!(!shown.contains(&secret.replace('/', "%2F")), "{shown}");
            assert!(shown.contains("***"), "{shown}");
        }
        assert_eq!(
            label(Path::new(
                "postgres://pwuser:SE/CR?ET@db.example:5433/fleet"
            )),
            "postgres://pwuser:***@db.example:5433/fleet"
        );
    }

    /// The driver reads a URL up to its first `@` as the user part: with a
    /// raw `@` in the password the rest was the host, and the masked URL
    /// showed it. A raw `&` in `?password=` made the rest an option the
    /// driver's error named. Neither URL is shown, in whole or in part.
    #[test]
    fn urls_whose_password_would_show_as_another_part_are_refused_unshown() {
        for (url, pieces) in [
            (
                "postgres://u:Kq7vX@Tp5yW/Hd2jV@db.example/fleet",
                &["Kq7vX", "Tp5yW", "Hd2jV"][..],
            ),
            ("postgres://u:pa@Zq8vW@host/db", &["Zq8vW"]),
            (
                "postgres://u:ab@cdefg?application_name=x@host/db",
                &["cdefg"],
            ),
            (
                "postgres://u@h/db?password=Kq7vX&Gh6tM=Pv3kA",
                &["Kq7vX", "Gh6tM", "Pv3kA"],
            ),
        ] {
            let e = PgUrl::parse(url).unwrap_err();
            let shown = label(Path::new(url));
            for piece in pieces {
                assert!(!e.contains(piece), "{url}: {e}");
                assert!(!shown.contains(piece), "{url}: {shown}");
            }
            assert!(e.contains("percent-encode"), "{e}");
        }
        // An `@` percent-encoded reads as meant.
        let url = PgUrl::parse("postgres://u:pa%40ss@host/db").unwrap();
        assert_eq!(url.config().get_password(), Some(&b"pa@ss"[..]));
        assert_eq!(url.to_string(), "postgres://u:***@host:5432/db");
    }

    #[test]
    fn every_url_given_is_masked_in_text_we_did_not_write() {
        let given = [
            "--registry=postgres://u:s3cr%2Fet@h/db".to_string(),
            "postgresql://u:Kq7vX@Tp5yW@h/db".to_string(),
            "/var/lib/fleet/registry.sqlite".to_string(),
        ];
        let text = "error: unexpected argument 'postgresql://u:Kq7vX@Tp5yW@h/db' found; \
                    '--registry=postgres://u:s3cr%2Fet@h/db' /var/lib/fleet/registry.sqlite";
        let masked = mask_in(text, &given);
        for piece in ["s3cr", "Kq7vX", "Tp5yW"] {
            assert!(!masked.contains(piece), "{masked}");
        }
        assert!(masked.contains("postgres://u:***@h:5432/db"), "{masked}");
        assert!(
            masked.contains("/var/lib/fleet/registry.sqlite"),
            "{masked}"
        );
    }

    #[test]
    fn urls_without_passwords_and_files_show_as_they_are() {
        assert_eq!(
            label(Path::new("postgres://fleet@127.0.0.1:5432/registry")),
            "postgres://fleet@127.0.0.1:5432/registry"
        );
        assert_eq!(
            label(Path::new("/var/lib/fleet/registry.sqlite")),
            "/var/lib/fleet/registry.sqlite"
        );
        assert!(!label(Path::new("postgres://u:sec ret@h:notaport/db")).contains("sec"));
    }

    fn tls_of(url: &str, env: &[(&str, &str)]) -> Result<Tls, String> {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        PgUrl::parse_with(url, &|name| {
            env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        })
        .map(|u| u.tls().clone())
    }

    #[test]
    fn a_host_that_is_not_this_machine_is_verified_unless_told_otherwise() {
        let t = tls_of("postgres://u@db.example/fleet", &[]).unwrap();
        assert_eq!(
            (t.mode, t.named, t.local),
            (SslMode::VerifyFull, false, false)
        );
        let t = tls_of("postgres://u@127.0.0.1:5432,[::1]:5433/fleet", &[]).unwrap();
        assert_eq!((t.mode, t.local), (SslMode::Prefer, true));
        // One remote member makes the whole URL remote.
        let t = tls_of("postgres://u@127.0.0.1,db.example/fleet", &[]).unwrap();
        assert_eq!(t.mode, SslMode::VerifyFull);
        let t = tls_of("postgres://u@db.example/fleet?sslmode=disable", &[]).unwrap();
        assert_eq!((t.mode, t.named), (SslMode::Disable, true));
        let t = tls_of("postgres://u@db.example/fleet", &[("PGSSLMODE", "require")]).unwrap();
        assert_eq!((t.mode, t.named), (SslMode::Require, true));
        // The URL wins over the environment, as in libpq.
        let t = tls_of(
            "postgres://u@db.example/fleet?sslmode=verify-ca",
            &[("PGSSLMODE", "disable")],
        )
        .unwrap();
        assert_eq!(t.mode, SslMode::VerifyCa);
        assert!(tls_of("postgres://u@h/db?sslmode=verify_full", &[])
            .unwrap_err()
            .contains("verify-full"));
    }

    #[test]
    fn tls_parameters_are_ours_and_the_rest_the_drivers() {
        let url = PgUrl::parse_with(
            "postgres://u:p?w@db.example:6432/fleet?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem\
             &target_session_attrs=read-write&sslcert=/c.pem&sslkey=/k.pem",
            &|_| None,
        )
        .unwrap();
        let t = url.tls();
        assert_eq!(t.root.as_deref(), Some("/etc/ca.pem"));
        assert_eq!(
            (t.cert.as_deref(), t.key.as_deref()),
            (Some("/c.pem"), Some("/k.pem"))
        );
        assert_eq!(url.config().get_password(), Some(&b"p?w"[..]));
        assert_eq!(
            url.config().get_target_session_attrs(),
            postgres::config::TargetSessionAttrs::ReadWrite
        );
        // require with a root file checks the chain, as libpq does.
        let t = tls_of("postgres://u@h/db?sslmode=require&sslrootcert=/ca.pem", &[]).unwrap();
        assert_eq!(t.mode, SslMode::VerifyCa);
        assert!(PgUrl::parse("postgres://u@h/db?bogus=1").is_err());
    }

    #[test]
    fn urls_that_could_be_read_two_ways_are_refused() {
        // hostaddr is where the driver connects: a remote one is remote.
        let t = tls_of("postgres://u@localhost:6543/db?hostaddr=192.0.2.2", &[]).unwrap();
        assert_eq!((t.mode, t.local), (SslMode::VerifyFull, false));
        let t = tls_of("postgres://u@localhost:6543/db?hostaddr=127.0.0.1", &[]).unwrap();
        assert_eq!(t.mode, SslMode::Prefer);
        // An `@` in a value hides the query from a reader looking after the
        // last `@`; the TLS parameter is not silently dropped.
        let e = tls_of(
            "postgres://u@127.0.0.1:6545/db?sslmode=require&application_name=ops@bastion",
            &[],
        )
        .unwrap_err();
        assert!(e.contains("percent-encode"), "{e}");
        let e = tls_of("postgres://u@h/db?sslmode=disable&sslmode=verify-full", &[]).unwrap_err();
        assert!(e.contains("twice"), "{e}");
    }

    #[test]
    fn locations_are_told_apart() {
        assert!(is_postgres(Path::new("postgres://h/db")));
        assert!(is_postgres(Path::new("postgresql://h/db")));
        assert!(!is_postgres(Path::new("/tmp/postgres://x")));
        assert!(!is_postgres(Path::new("registry.sqlite")));
    }
}
