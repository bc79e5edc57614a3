//! The `fleet-retire` binary: parse arguments, dispatch, map the outcome to
//! an exit code. Nothing else lives here.

fn main() -> std::process::ExitCode {
    // An internal invariant failing is a bug: say so plainly, without a
    // backtrace, and exit 1. A transaction that had not committed is rolled
    // back by SQLite on the next open.
    std::panic::set_hook(Box::new(|info| {
        eprintln!(
            "fleet-retire: internal error (a bug, please report it): {info}. \
             An uncommitted apply is rolled back by SQLite; check the registry with \
             `fleet-retire snapshot`."
        );
        std::process::exit(1);
    }));
    fleet_retire::error::on_bus_error();
    // A command line we cannot read is bad input (exit 1, as documented),
    // not a refusal (2, which clap would use); help and --version are 0.
    let cli = match fleet_retire::cli::parse() {
        Ok(cli) => cli,
        Err(e) => {
            // clap quotes an argument as it was typed (`unexpected argument
            // 'postgres://u:pw@…'`): every URL given is masked first.
            let rendered = e.render().to_string();
            let masked = fleet_retire::store::location::mask_given(&rendered);
            if masked == rendered {
                let _ = e.print();
            } else if e.use_stderr() {
                eprint!("{masked}");
            } else {
                print!("{masked}");
            }
            if let Some(hint) = fleet_retire::cli::missing_env_hint(&e) {
                eprintln!("{hint}");
            }
            // Under --format json a command line that cannot be read is a
            // JSON error too (kind `usage`), read from the arguments as given.
            if e.use_stderr() && asks_for_json() {
                use std::io::Write as _;
                let envelope = serde_json::json!({"error": {
                    "kind": "usage",
                    "exit_code": 1,
                    "message": e.kind().to_string(),
                    "detail": masked.trim_end(),
                    "reason_code": "bad_usage",
                    "what_to_do": "correct the command line as the detail says; \
                                   `fleet-retire COMMAND --help` lists what each command takes",
                }});
                let _ = writeln!(std::io::stdout(), "{envelope}");
            }
            return std::process::ExitCode::from(if e.use_stderr() { 1 } else { 0 });
        }
    };
    let (json_logs, level) = fleet_retire::cli::log_style(&cli);
    let filter = tracing_subscriber::EnvFilter::try_from_env("FLEET_RETIRE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let logs = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter);
    if json_logs {
        logs.json()
            .with_current_span(true)
            .with_span_list(false)
            .init();
    } else {
        logs.init();
    }
    let json = cli.format == fleet_retire::cli::Format::Json;
    match fleet_retire::cli::run(cli) {
        Ok(code) => code,
        // The reader of our output went away (`| head`): it has all it
        // wanted. End quietly.
        Err(e) if e.is_closed_pipe() => fleet_retire::error::ExitCode::Ok,
        Err(e) => {
            // Each failure's message carries its cause (SQLite's or the
            // operating system's words) and what to do; under --format
            // json it is also a JSON document on stdout. Stores are named
            // masked where the message is made; a URL given where a store
            // was not meant is masked here.
            let message = fleet_retire::store::location::mask_given(&e.to_string());
            eprintln!("fleet-retire: {message}");
            if json {
                use std::io::Write as _;
                let mut envelope = e.envelope();
                envelope["error"]["message"] = serde_json::Value::String(message);
                let _ = writeln!(std::io::stdout(), "{envelope}");
            }
            e.exit_code()
        }
    }
    .into()
}

/// Whether the arguments, as given, ask for `--format json`.
fn asks_for_json() -> bool {
    let args: Vec<String> = std::env::args().collect();
    args.iter().any(|a| a == "--format=json")
        || args
            .windows(2)
            .any(|w| w[0] == "--format" && w[1] == "json")
}
