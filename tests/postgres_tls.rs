//! TLS to PostgreSQL, against a real server: a cluster of Debian's
//! PostgreSQL started here with `ssl = on`, a certificate authority made
//! here (with OpenSSL, through the `openssl` crate), and a `pg_hba.conf`
//! that refuses every plain-text connection of the `fleet` user. Every
//! command that connects (registry copy, plan, snapshot, apply, the worker
//! commands, serve and its heartbeats) must therefore speak TLS to it, and
//! `pg_stat_ssl` says so of a running `serve`. A wrong root, a certificate
//! for another host, an expired certificate and a server without TLS are
//! each refused with a message that says what to do; a host that is not
//! this machine gets `verify-full` without asking, and plain text only when
//! the URL says `sslmode=disable`, with a warning.

mod common;

use common::*;
use openssl::asn1::Asn1Time;
use openssl::ec::{EcGroup, EcKey};
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::{PKey, Private};
use openssl::x509::extension::{BasicConstraints, KeyUsage, SubjectAlternativeName};
use openssl::x509::{X509NameBuilder, X509};
use std::path::{Path, PathBuf};
use std::process::Command;

const PASSWORD: &str = "tls-test-secret";

/// A key and its certificate.
struct Issued {
    key: PKey<Private>,
    cert: X509,
}

fn key() -> PKey<Private> {
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap();
    PKey::from_ec_key(EcKey::generate(&group).unwrap()).unwrap()
}

/// A certificate for `cn`, valid from `from` to `to` days from now, with
/// the subject alternative names `dns` and `ips`, signed by `ca` (or by
/// itself, as a CA, when `ca` is `None`).
fn issue(cn: &str, ca: Option<&Issued>, from: i64, to: i64, dns: &[&str], ips: &[&str]) -> Issued {
    let key = key();
    let mut name = X509NameBuilder::new().unwrap();
    name.append_entry_by_nid(Nid::COMMONNAME, cn).unwrap();
    let name = name.build();
    let mut b = X509::builder().unwrap();
    b.set_version(2).unwrap();
    let serial = openssl::bn::BigNum::from_u32(rand_serial()).unwrap();
    b.set_serial_number(&serial.to_asn1_integer().unwrap())
        .unwrap();
    b.set_subject_name(&name).unwrap();
    b.set_issuer_name(ca.map_or(&name, |c| c.cert.subject_name()))
        .unwrap();
    b.set_pubkey(&key).unwrap();
    let now = chrono::Utc::now().timestamp();
    b.set_not_before(&Asn1Time::from_unix(now + from * 86_400).unwrap())
        .unwrap();
    b.set_not_after(&Asn1Time::from_unix(now + to * 86_400).unwrap())
        .unwrap();
    if ca.is_none() {
        b.append_extension(BasicConstraints::new().critical().ca().build().unwrap())
            .unwrap();
        b.append_extension(KeyUsage::new().key_cert_sign().crl_sign().build().unwrap())
            .unwrap();
    } else {
        let mut san = SubjectAlternativeName::new();
        for d in dns {
            san.dns(d);
        }
        for ip in ips {
            san.ip(ip);
        }
        let ctx = b.x509v3_context(ca.map(|c| c.cert.as_ref()), None);
        let san = san.build(&ctx).unwrap();
        b.append_extension(san).unwrap();
    }
    b.sign(ca.map_or(&key, |c| &c.key), MessageDigest::sha256())
        .unwrap();
    Issued {
        key,
        cert: b.build(),
    }
}

fn rand_serial() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed) + std::process::id() % 10_000 * 1000
}

fn write_pem(path: &Path, issued: &Issued) {
    std::fs::write(path.with_extension("crt"), issued.cert.to_pem().unwrap()).unwrap();
    std::fs::write(
        path.with_extension("key"),
        issued.key.private_key_to_pem_pkcs8().unwrap(),
    )
    .unwrap();
}

/// This machine's first address that is not loopback, if it has one.
fn own_address() -> Option<String> {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect("198.51.100.1:9").ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then(|| ip.to_string())
}

/// A PostgreSQL cluster of our own with TLS on; stopped on drop.
struct TlsCluster {
    dir: tempfile::TempDir,
    bindir: PathBuf,
    port: u16,
}

fn as_owner(program: &Path) -> Command {
    if nix::unistd::Uid::effective().is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

impl TlsCluster {
    /// initdb, the server's certificate (`server`, signed by the test CA)
    /// and CA for client certificates, then start it listening on
    /// loopback and `also` (this machine's other address).
    fn start(server: &Issued, ca: &Issued, also: &str) -> Option<TlsCluster> {
        let bindir = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
            .find(|b| b.join("initdb").is_file())?;
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let pwfile = dir.path().join("pw");
        std::fs::write(&pwfile, PASSWORD).unwrap();
        if nix::unistd::Uid::effective().is_root() {
            Command::new("chown")
                .args(["-R", "postgres:"])
                .arg(dir.path())
                .status()
                .unwrap();
        }
        let init = as_owner(&bindir.join("initdb"))
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                "fleet",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "-E",
                "UTF8",
            ])
            .arg(format!("--pwfile={}", pwfile.display()))
            .output()
            .unwrap();
        assert!(init.status.success(), "{}", text(&init));
        let cluster = TlsCluster {
            dir,
            bindir,
            port: free_port(),
        };
        cluster.install(server, ca);
        std::fs::write(
            data.join("pg_hba.conf"),
            "local all all trust\n\
             hostssl all certuser all cert\n\
             hostssl all all all scram-sha-256\n\
             hostnossl all plain all scram-sha-256\n\
             hostnossl all all all reject\n",
        )
        .unwrap();
        let conf = format!(
            "\nssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n\
             ssl_ca_file = 'ca.crt'\nlisten_addresses = '127.0.0.1,{also}'\nport = {}\n\
             unix_socket_directories = '{}'\nfsync = off\n",
            cluster.port,
            cluster.dir.path().display()
        );
        let mut text_now = std::fs::read_to_string(data.join("postgresql.conf")).unwrap();
        text_now.push_str(&conf);
        std::fs::write(data.join("postgresql.conf"), text_now).unwrap();
        cluster.chown();
        let started = as_owner(&cluster.bindir.join("pg_ctl"))
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(cluster.dir.path().join("server.log"))
            .args(["-w", "start"])
            .output()
            .unwrap();
        assert!(started.status.success(), "{}", text(&started));
        cluster.psql("CREATE ROLE plain LOGIN PASSWORD 'plain-secret'; CREATE ROLE certuser LOGIN");
        cluster.psql("CREATE DATABASE fleetdb");
        cluster.psql("GRANT ALL ON DATABASE fleetdb TO plain, certuser");
        cluster.psql_in("fleetdb", "GRANT ALL ON SCHEMA public TO plain, certuser");
        Some(cluster)
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn chown(&self) {
        if nix::unistd::Uid::effective().is_root() {
            Command::new("chown")
                .args(["-R", "postgres:"])
                .arg(self.dir.path())
                .status()
                .unwrap();
        }
    }

    /// Put a server certificate (and the CA that signs client
    /// certificates) in place; reload when running.
    fn install(&self, server: &Issued, ca: &Issued) {
        write_pem(&self.data().join("server"), server);
        std::fs::write(self.data().join("ca.crt"), ca.cert.to_pem().unwrap()).unwrap();
        self.chown();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            self.data().join("server.key"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
    }

    /// Swap the server's certificate for `server` and reload.
    fn serve_certificate(&self, server: &Issued, ca: &Issued) {
        self.install(server, ca);
        self.psql("SELECT pg_reload_conf()");
        std::thread::sleep(std::time::Duration::from_millis(500));
    }

    fn psql(&self, sql: &str) -> String {
        self.psql_in("postgres", sql)
    }

    /// Run SQL over the Unix socket as the superuser.
    fn psql_in(&self, db: &str, sql: &str) -> String {
        let out = Command::new(self.bindir.join("psql"))
            .args(["-h"])
            .arg(self.dir.path())
            .args([
                "-p",
                &self.port.to_string(),
                "-U",
                "fleet",
                "-d",
                db,
                "-Atc",
                sql,
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{sql}: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// A URL to `host` for `user`, with the query `query`.
    fn url(&self, user: &str, host: &str, query: &str) -> String {
        format!("postgres://{user}@{host}:{}/fleetdb{query}", self.port)
    }
}

impl Drop for TlsCluster {
    fn drop(&mut self) {
        let _ = as_owner(&self.bindir.join("pg_ctl"))
            .arg("-D")
            .arg(self.data())
            .args(["-m", "immediate", "-w", "stop"])
            .output();
    }
}

/// The CA, a good server certificate, the cluster, and this machine's
/// other address; `None` (a skip) when PostgreSQL's server is missing.
fn setup() -> Option<(tempfile::TempDir, Issued, TlsCluster, String)> {
    let Some(also) = own_address() else {
        skip_unless(false, "an address of this machine that is not loopback");
        return None;
    };
    let ca = issue("fleet-retire test CA", None, -1, 30, &[], &[]);
    let server = issue(
        "db.test",
        Some(&ca),
        -1,
        30,
        &["localhost", "db.test"],
        &["127.0.0.1", &also],
    );
    let cluster = TlsCluster::start(&server, &ca, &also);
    if skip_unless(
        cluster.is_some(),
        "PostgreSQL's server (Debian package postgresql)",
    ) {
        return None;
    }
    let files = tempfile::tempdir().unwrap();
    std::fs::write(files.path().join("ca.crt"), ca.cert.to_pem().unwrap()).unwrap();
    Some((files, ca, cluster?, also))
}

/// With `verify-full` and the test CA, every command that connects works
/// against a server that refuses every plain-text connection of its user,
/// and a running `serve`'s connections show in `pg_stat_ssl` as TLS.
#[test]
#[cfg_attr(
    not(fr_patroni),
    ignore = "needs Debian's patroni, etcd-server and curl (.ci/run installs them)"
)]
fn every_command_speaks_verified_tls() {
    let Some((files, _ca, cluster, _)) = setup() else {
        return;
    };
    let root = files.path().join("ca.crt");
    let query = format!("?sslmode=verify-full&sslrootcert={}", root.display());
    let url = cluster.url(&format!("fleet:{PASSWORD}"), "127.0.0.1", &query);
    let (mut stores, live) = fleet();
    let copied = bin()
        .args(["registry", "copy", "--from"])
        .arg(&stores.registry)
        .arg("--leases")
        .arg(&stores.leases)
        .args(["--to", &url])
        .output()
        .unwrap();
    assert!(copied.status.success(), "{}", text(&copied));
    stores.registry = PathBuf::from(&url);
    stores.leases = PathBuf::from(&url);
    let (plan, _) = save_plan(&stores);
    let (code, report) = apply_cli(&stores, &plan, "controller-prgs", &[]);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["retired_count"], 3, "{report}");
    let snapshot = bin()
        .args([
            "--format",
            "json",
            "snapshot",
            "--registry",
            &url,
            "--leases",
            &url,
        ])
        .args(["--canonical-repository", "prgs/gitea-tools", "--profiles"])
        .arg(&stores.profiles)
        .args(["--profile", "controller-prgs"])
        .output()
        .unwrap();
    assert!(snapshot.status.success(), "{}", text(&snapshot));
    for command in ["register", "heartbeat", "release"] {
        let mut c = bin();
        c.arg(command).args(["--registry", &url]);
        if command == "register" {
            c.args(["--namespace", "author"]);
        }
        let out = c
            .env("GITEA_MCP_WORKER_IDENTITY", "w-tls-worker")
            .output()
            .unwrap();
        assert!(out.status.success(), "{command}: {}", text(&out));
    }
    let mut server = serve_heartbeating(&stores, "w-tls-serve", "sess-tls");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while cluster.psql_in(
        "fleetdb",
        "SELECT count(*) FROM worker_registrations WHERE worker_identity = 'w-tls-serve' \
         AND status = 'active'",
    ) != "1"
    {
        assert!(
            std::time::Instant::now() < deadline,
            "serve did not register itself over TLS"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let seen = cluster.psql(
        "SELECT count(*), bool_and(s.ssl) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
         WHERE a.application_name = 'fleet-retire'",
    );
    let (n, all_tls) = seen.split_once('|').unwrap();
    assert!(
        n.parse::<u32>().unwrap() >= 1,
        "serve holds a connection: {seen}"
    );
    assert_eq!(all_tls, "t", "every connection of serve is TLS: {seen}");
    let _ = server.0.kill();
    drop(live);
}

/// `snapshot` of the stores at `url` (any command that connects would do).
fn probe(url: &str, profiles: &Path) -> std::process::Output {
    bin()
        .args([
            "--format",
            "json",
            "snapshot",
            "--registry",
            url,
            "--leases",
            url,
        ])
        .args(["--canonical-repository", "prgs/gitea-tools", "--profiles"])
        .arg(profiles)
        .args(["--profile", "controller-prgs"])
        .env_remove("PGSSLMODE")
        .env_remove("PGSSLROOTCERT")
        .env("HOME", "/nonexistent")
        .env("PGPASSWORD", PASSWORD)
        .output()
        .unwrap()
}

fn refused(out: &std::process::Output, says: &str) {
    assert_eq!(out.status.code(), Some(1), "{}", text(out));
    let all = text(out);
    assert!(all.contains(says), "expected {says:?} in: {all}");
    assert!(!all.contains(PASSWORD), "the password shows: {all}");
}

/// What is refused, and how a host that is not this machine is treated.
#[test]
#[cfg_attr(
    not(fr_patroni),
    ignore = "needs Debian's patroni, etcd-server and curl (.ci/run installs them)"
)]
fn certificates_that_do_not_prove_the_server_are_refused() {
    let Some((files, ca, cluster, also)) = setup() else {
        return;
    };
    let root = files.path().join("ca.crt");
    let verified = |host: &str, mode: &str| {
        cluster.url(
            "fleet",
            host,
            &format!("?sslmode={mode}&sslrootcert={}", root.display()),
        )
    };
    let (stores, live) = fleet();
    let copied = bin()
        .args(["registry", "copy", "--from"])
        .arg(&stores.registry)
        .arg("--leases")
        .arg(&stores.leases)
        .args(["--to", &verified("127.0.0.1", "verify-full")])
        .env("PGPASSWORD", PASSWORD)
        .output()
        .unwrap();
    assert!(copied.status.success(), "{}", text(&copied));
    cluster.psql_in(
        "fleetdb",
        "GRANT ALL ON worker_registrations, retirement_audit, workflow_leases \
         TO plain, certuser",
    );
    let profiles = &stores.profiles;
    assert!(probe(&verified("127.0.0.1", "verify-full"), profiles)
        .status
        .success());

    // A root that did not sign the server's certificate.
    let other = issue("another CA", None, -1, 30, &[], &[]);
    let other_root = files.path().join("other.crt");
    std::fs::write(&other_root, other.cert.to_pem().unwrap()).unwrap();
    let url = cluster.url(
        "fleet",
        "127.0.0.1",
        &format!("?sslmode=verify-ca&sslrootcert={}", other_root.display()),
    );
    refused(&probe(&url, profiles), "certificate");

    // This machine's other address, with no sslmode: verify-full against
    // the system's roots, which do not hold the test CA.
    refused(
        &probe(&cluster.url("fleet", &also, ""), profiles),
        "certificate",
    );
    // The test CA named: verified, the host name (its address) checked.
    assert!(probe(
        &cluster.url("fleet", &also, &format!("?sslrootcert={}", root.display())),
        profiles
    )
    .status
    .success());
    // Plain text to it only when the URL says so, and then a warning.
    let plain = cluster.url("plain:plain-secret", &also, "?sslmode=disable");
    let out = probe(&plain, profiles);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("is not this machine, and sslmode=disable"),
        "{}",
        text(&out)
    );
    // The same user without sslmode is held to verify-full.
    refused(
        &probe(&cluster.url("plain:plain-secret", &also, ""), profiles),
        "certificate",
    );

    // A client certificate in place of a password.
    let client = issue("certuser", Some(&ca), -1, 30, &[], &[]);
    write_pem(&files.path().join("client"), &client);
    let url = cluster.url(
        "certuser",
        "127.0.0.1",
        &format!(
            "?sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}",
            root.display(),
            files.path().join("client.crt").display(),
            files.path().join("client.key").display()
        ),
    );
    let out = probe(&url, profiles);
    assert!(out.status.success(), "{}", text(&out));

    // A certificate for another host: verify-full refuses, verify-ca takes it.
    let elsewhere = issue("db.example", Some(&ca), -1, 30, &["db.example"], &[]);
    cluster.serve_certificate(&elsewhere, &ca);
    refused(
        &probe(&verified("127.0.0.1", "verify-full"), profiles),
        "certificate",
    );
    assert!(probe(&verified("127.0.0.1", "verify-ca"), profiles)
        .status
        .success());

    // An expired certificate is refused, even by verify-ca.
    let expired = issue("db.test", Some(&ca), -3, -1, &["localhost"], &["127.0.0.1"]);
    cluster.serve_certificate(&expired, &ca);
    refused(
        &probe(&verified("127.0.0.1", "verify-ca"), profiles),
        "certificate",
    );
    drop(live);
}

/// A server that does not speak TLS, asked for it: refused, saying what to
/// do (the shared test cluster runs without TLS).
#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn a_server_without_tls_is_refused_with_what_to_do() {
    let Some(db) = postgres("no_tls") else {
        return;
    };
    let stores = Stores::new(&[]);
    let url = format!("{}?sslmode=require", db.url);
    let out = probe(&url, &stores.profiles);
    refused(&out, "does not speak TLS");
    assert!(text(&out).contains("sslmode=disable"), "{}", text(&out));
}
