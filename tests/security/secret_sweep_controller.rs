//! The secret sweep's part for `fleet-retire controller` (issue 53): a
//! password in a store's URL never appears in its log on stderr (human or
//! JSON, debug on), in `/metrics`, `/livez` or `/readyz`, nor in what it
//! says when a store fails.

use super::{Case, Context, Sweep, Takes};
use crate::common::controller::get;
use crate::common::{free_port, KillOnDrop};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The short lease times of the controller's tests.
const TIMES: [&str; 6] = [
    "--lease-ttl",
    "3s",
    "--renew-deadline",
    "2s",
    "--retry-period",
    "500ms",
];

/// `controller` on `case`'s stores (a dry run: it writes only its own
/// lease) with `--log-format log`, then `more`.
fn command(case: &Case, ctx: &Context, log: &str, more: &[&str]) -> Command {
    let mut rest = ctx.operator(&["--dry-run", "--log-format", log]);
    rest.extend(TIMES.iter().chain(more).map(|s| s.to_string()));
    let mut command = case.command("human", &["controller"], Takes::Both, &rest);
    command.current_dir(&ctx.dir);
    command
}

/// `controller --once` in both log formats, meant to end with one of
/// `codes` (0 on working stores, 1 on a broken one).
pub fn once(sweep: &mut Sweep, case: &Case, ctx: &Context, tag: &str, codes: &[i32]) {
    for log in ["human", "json"] {
        let mut c = command(case, ctx, log, &["--once", "--listen", "none"]);
        let what = format!("controller --once --log-format {log}, {tag}");
        sweep.expect(&what, &mut c, codes);
    }
}

/// A controller serving its endpoints on `case`'s stores: every answer
/// once it has ticked, then its log (both formats) after SIGTERM.
pub fn serving(sweep: &mut Sweep, case: &Case, ctx: &Context) {
    for log in ["human", "json"] {
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        let mut c = command(case, ctx, log, &["--listen", &listen, "--interval", "1s"]);
        let log_file = ctx.dir.join(format!("controller-{log}-{port}.log"));
        c.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log_file).unwrap());
        let mut child = KillOnDrop(c.spawn().unwrap());
        sweep.runs += 1;
        let tag = format!("a serving controller ({log} log), password {}", case.name);
        let started = Instant::now();
        let ticked = loop {
            let up = std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
            if up && get(port, "/metrics", None).1.contains("ticks_total{") {
                break true;
            }
            if started.elapsed() > Duration::from_secs(30) || child.0.try_wait().unwrap().is_some()
            {
                break false;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        if ticked {
            for path in ["/metrics", "/livez", "/readyz"] {
                let (code, body) = get(port, path, None);
                sweep.look(&format!("{path} of {tag}"), &format!("{code} {body}"));
            }
        } else {
            sweep.wrong.push(format!("{tag}: never ticked"));
        }
        let pid = nix::unistd::Pid::from_raw(child.0.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let status = child.0.wait().unwrap();
        let said = std::fs::read_to_string(&log_file).unwrap_or_default();
        sweep.look(&format!("the log of {tag}"), &said);
        if status.code() != Some(0) || !said.contains("controller stopped") {
            sweep.wrong.push(format!(
                "{tag}: exit {:?} after SIGTERM: {said}",
                status.code()
            ));
        }
    }
}
