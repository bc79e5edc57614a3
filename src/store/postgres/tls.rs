//! TLS for every PostgreSQL connection, with libpq's meanings, and the
//! TCP bounds that keep a lost server from hanging a command.
//!
//! The mode comes from the URL (`store::pgurl`): to a host that is not
//! this machine the default is `verify-full`, so the server's certificate
//! is checked (chain and host name) during the handshake, before the
//! startup message and any password are sent. Plain text there happens
//! only when the operator names it (`sslmode=disable`, or `prefer` /
//! `require`, which do not check the certificate), and every command that
//! does so says so on standard error.
//!
//! Roots: `sslrootcert=FILE` (those certificates alone), `sslrootcert=system`
//! (the system's store), or, when unnamed, `~/.postgresql/root.crt` if it
//! exists and the system's store otherwise. A client certificate is
//! `sslcert` and `sslkey` (default `~/.postgresql/postgresql.crt` and
//! `.key` when both exist), as in libpq.

use super::PgUrl;
use crate::store::pgurl::{SslMode, Tls};
use openssl::ssl::{SslConnector, SslFiletype, SslMethod, SslVerifyMode};
use openssl::x509::store::X509StoreBuilder;
use openssl::x509::X509;
use postgres_openssl::MakeTlsConnector;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Mutex;

/// The connector for a URL's TLS settings; the error says what to fix.
pub fn connector(tls: &Tls) -> Result<MakeTlsConnector, String> {
    let mut builder = SslConnector::builder(SslMethod::tls_client()).map_err(|e| e.to_string())?;
    if tls.mode.verifies() {
        load_roots(&mut builder, tls)?;
    } else {
        builder.set_verify(SslVerifyMode::NONE);
    }
    if let Some((cert, key)) = client_identity(tls)? {
        builder
            .set_certificate_chain_file(&cert)
            .map_err(|e| format!("sslcert {}: cannot be read as PEM ({e})", cert.display()))?;
        builder
            .set_private_key_file(&key, SslFiletype::PEM)
            .map_err(|e| {
                format!(
                    "sslkey {}: cannot be read as a PEM key ({e})",
                    key.display()
                )
            })?;
        builder.check_private_key().map_err(|e| {
            format!(
                "sslkey {} is not the key of sslcert {} ({e})",
                key.display(),
                cert.display()
            )
        })?;
    }
    let mut connector = MakeTlsConnector::new(builder.build());
    if tls.mode == SslMode::VerifyCa {
        connector.set_callback(|config, _| {
            config.set_verify_hostname(false);
            Ok(())
        });
    }
    Ok(connector)
}

/// The home folder's `.postgresql/NAME`, libpq's default place.
fn in_home(name: &str) -> Option<PathBuf> {
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".postgresql").join(name))
}

/// Trust the roots named (or libpq's default file, or the system's).
fn load_roots(builder: &mut openssl::ssl::SslConnectorBuilder, tls: &Tls) -> Result<(), String> {
    let file = match tls.root.as_deref() {
        Some("system") => None,
        Some(path) => Some(PathBuf::from(path)),
        None => in_home("root.crt").filter(|p| p.is_file()),
    };
    let Some(file) = file else {
        // SslConnector::builder trusts the system's store already.
        return Ok(());
    };
    let shown = file.display();
    let pem =
        std::fs::read(&file).map_err(|e| format!("sslrootcert {shown}: cannot read ({e})"))?;
    let certs = X509::stack_from_pem(&pem)
        .map_err(|e| format!("sslrootcert {shown}: not PEM certificates ({e})"))?;
    if certs.is_empty() {
        return Err(format!("sslrootcert {shown}: holds no certificate"));
    }
    let mut store = X509StoreBuilder::new().map_err(|e| e.to_string())?;
    for cert in certs {
        store
            .add_cert(cert)
            .map_err(|e| format!("sslrootcert {shown}: {e}"))?;
    }
    // The given roots replace the system's, as libpq's sslrootcert does.
    builder.set_cert_store(store.build());
    Ok(())
}

/// The client certificate and key: both named, or libpq's default files
/// when both exist, or none.
fn client_identity(tls: &Tls) -> Result<Option<(PathBuf, PathBuf)>, String> {
    match (&tls.cert, &tls.key) {
        (Some(c), Some(k)) => Ok(Some((c.into(), k.into()))),
        (Some(_), None) | (None, Some(_)) => Err(
            "sslcert and sslkey go together: name both (the certificate and its key) or neither"
                .into(),
        ),
        (None, None) => Ok(in_home("postgresql.crt")
            .zip(in_home("postgresql.key"))
            .filter(|(c, k)| c.is_file() && k.is_file())),
    }
}

/// URLs already warned about in this process.
static WARNED: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// Say, once per command and URL, that a connection to a host that is not
/// this machine will not check the server's certificate.
pub fn warn_if_unverified(url: &PgUrl) {
    let tls = url.tls();
    if tls.local || tls.mode.verifies() {
        return;
    }
    let Ok(mut warned) = WARNED.lock() else {
        return;
    };
    if !warned.insert(url.to_string()) {
        return;
    }
    let what = match tls.mode {
        SslMode::Disable => "in plain text",
        SslMode::Prefer => "in plain text if the server offers no TLS, and otherwise without checking its certificate",
        _ => "without checking the server's certificate",
    };
    eprintln!(
        "warning: {url} is not this machine, and sslmode={} sends everything, the password \
         included, {what}; anyone on the path can read or change it. Use sslmode=verify-full \
         (the default) with sslrootcert=FILE",
        tls.mode.name()
    );
}

/// The driver's default keepalive idle time (two hours: the kernel's).
const DRIVER_IDLE: std::time::Duration = std::time::Duration::from_secs(2 * 60 * 60);

/// Bound every wait on the network a URL did not bound itself (libpq's
/// `connect_timeout`, `keepalives_idle`, `keepalives_interval`,
/// `keepalives_retries`, `tcp_user_timeout` in the URL win): a connection
/// attempt gives up after 10 s; an idle connection is probed after 10 s,
/// every 5 s, and dropped after 3 unanswered probes; data the server does
/// not acknowledge for 30 s closes the connection. A vanished server is
/// then an error in tens of seconds, not after the kernel's retransmission
/// limit of about 15 minutes.
pub fn bound_waits(config: &mut postgres::Config) {
    use std::time::Duration;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(super::CONNECT_TIMEOUT);
    }
    config.keepalives(true);
    if config.get_keepalives_idle() == DRIVER_IDLE {
        config.keepalives_idle(Duration::from_secs(10));
    }
    if config.get_keepalives_interval().is_none() {
        config.keepalives_interval(Duration::from_secs(5));
    }
    if config.get_keepalives_retries().is_none() {
        config.keepalives_retries(3);
    }
    if config.get_tcp_user_timeout().is_none() {
        config.tcp_user_timeout(Duration::from_secs(30));
    }
}
