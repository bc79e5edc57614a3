//! `completions` and `man`: generated from the command-line definitions.
//!
//! Bash completion works around clap_complete's open bug with a binary
//! whose name holds a hyphen (clap-rs/clap #6421 and #6529): the script it
//! writes escapes the name one way where it sets the command reached and
//! another in the arms that complete it, so nothing after the first word
//! ever completed. The script is generated for a name without a hyphen,
//! then bound to `fleet-retire`.

use crate::error::{Error, ExitCode, Result};
use clap::Args;
use std::path::{Path, PathBuf};

/// The program's name.
const NAME: &str = "fleet-retire";
/// The name the bash script is generated for: the same without its hyphen.
const BASH_NAME: &str = "fleetretire";

/// Arguments of `man`.
#[derive(Debug, Clone, Args)]
pub struct ManArgs {
    /// Write every page (fleet-retire.1 and one per command, such as
    /// fleet-retire-plan.1) into this folder instead of printing the main one.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// The completion script for `shell`.
pub fn script(shell: clap_complete::Shell) -> String {
    let mut command = super::command();
    let mut out = Vec::new();
    if shell != clap_complete::Shell::Bash {
        clap_complete::generate(shell, &mut command, NAME, &mut out);
        return String::from_utf8_lossy(&out).into_owned();
    }
    clap_complete::generate(shell, &mut command, BASH_NAME, &mut out);
    let text = String::from_utf8_lossy(&out);
    // Only the lines that register the function name the program; every
    // other mention is the function's own identifiers.
    text.lines()
        .map(|line| match line.trim_start().starts_with("complete ") {
            true => line
                .replace(&format!(" {BASH_NAME}"), &format!(" {NAME}"))
                .replace(&format!(" _{NAME}"), &format!(" _{BASH_NAME}")),
            false => line.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// The exit codes, as a man page section (roff).
fn exit_status() -> String {
    let codes = [
        (ExitCode::Ok, "done (for `policy report`: ready to sign; for `test`: every case passed)"),
        (ExitCode::Error, "bad input, a store that cannot be read, a failed fixture case"),
        (ExitCode::Refused, "ran, and refused: denied by a capability policy, tokens moved, over a limit, a loosening (`policy diff`), not safe (`snapshot --strict`)"),
        (ExitCode::InvalidPolicy, "an invalid policy or schema"),
        (ExitCode::ProofFailed, "a property does not hold of the policies (`policy verify`, `grants --against`)"),
        (ExitCode::OutcomeUnknown, "the connection was lost after an apply's COMMIT was sent: it may or may not have committed; `fleet-retire apply-status APPLY_ID` tells which"),
    ];
    let mut roff = String::from(".SH \"EXIT STATUS\"\n");
    for (code, meaning) in codes {
        roff.push_str(&format!(
            ".TP\n\\fB{}\\fR\n{}\n",
            code as u8,
            escape(meaning)
        ));
    }
    roff
}

/// Text safe in a roff paragraph: backslashes doubled, and a line never
/// starting with a control character.
fn escape(text: &str) -> String {
    let text = text.replace('\\', "\\e");
    match text.starts_with(['.', '\'']) {
        true => format!("\\&{text}"),
        false => text,
    }
}

/// One page: clap_mangen's sections, then EXIT STATUS.
fn page(command: clap::Command) -> Result<Vec<u8>> {
    let man = clap_mangen::Man::new(command);
    let mut out = Vec::new();
    man.render(&mut out).map_err(Error::Output)?;
    out.extend_from_slice(exit_status().as_bytes());
    Ok(out)
}

/// `man`: the main page on standard output, or every page into `--dir`.
pub fn man(args: &ManArgs) -> Result<ExitCode> {
    let mut command = super::command().disable_help_subcommand(true);
    command.build();
    let Some(dir) = &args.dir else {
        crate::out!("{}", String::from_utf8_lossy(&page(command)?))?;
        return Ok(ExitCode::Ok);
    };
    std::fs::create_dir_all(dir).map_err(Error::io(dir, "cannot create the folder"))?;
    let mut written = Vec::new();
    write_pages(command, dir, &mut written)?;
    crate::outln!("wrote {} man pages into {}", written.len(), dir.display())?;
    Ok(ExitCode::Ok)
}

/// The page of `command` and of each command under it, as
/// `fleet-retire-plan.1` and so on.
fn write_pages(command: clap::Command, dir: &Path, written: &mut Vec<PathBuf>) -> Result<()> {
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_pages(sub.clone(), dir, written)?;
    }
    let name = command
        .get_display_name()
        .unwrap_or_else(|| command.get_name())
        .to_string();
    let path = dir.join(crate::outfile::safe_name(&format!("{name}.1")));
    crate::outfile::replace(&path, &page(command)?)
        .map_err(Error::io(&path, "cannot write the man page"))?;
    written.push(path);
    Ok(())
}
