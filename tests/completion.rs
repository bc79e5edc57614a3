//! Shell completion and man pages as a user installs them (README,
//! "Try it"): the bash script completes in a real bash, and `man --dir`
//! writes every page the main page names, with the exit codes.

mod common;

use common::*;
use std::process::Command;

/// What bash completes for `line` (words; the last one being typed), with
/// the script `fleet-retire completions bash` printed, registered as a user
/// registers it.
fn bash_completes(script: &std::path::Path, words: &[&str]) -> Vec<String> {
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let program = format!(
        "source '{}'\n\
         f=$(complete -p fleet-retire | sed -E 's/.*-F ([^ ]+).*/\\1/')\n\
         COMP_WORDS=({})\n\
         COMP_CWORD={}\n\
         COMP_LINE=\"${{COMP_WORDS[*]}}\"\n\
         COMP_POINT=${{#COMP_LINE}}\n\
         \"$f\" fleet-retire \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"\n\
         printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        script.display(),
        quoted.join(" "),
        words.len() - 1
    );
    let out = Command::new("bash")
        .args(["--norc", "--noprofile", "-c", &program])
        .output()
        .expect("bash runs");
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

#[test]
fn bash_completes_options_of_a_subcommand() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("fleet-retire.bash");
    let out = run(&["completions", "bash"]);
    assert!(out.status.success(), "{}", text(&out));
    std::fs::write(&script, &out.stdout).unwrap();
    assert_eq!(bash_completes(&script, &["fleet-retire", "pl"]), ["plan"]);
    assert_eq!(
        bash_completes(&script, &["fleet-retire", "plan", "--reg"]),
        ["--registry"]
    );
    let formats = bash_completes(&script, &["fleet-retire", "registry", "ver"]);
    assert_eq!(formats, ["versions"]);
    let applied = bash_completes(&script, &["fleet-retire", "apply", "--bus"]);
    assert_eq!(applied, ["--busy-timeout-ms"]);
}

#[test]
fn man_dir_writes_every_page_the_pages_name_with_the_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(&["man", "--dir", dir.path().to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let main = std::fs::read_to_string(dir.path().join("fleet-retire.1")).unwrap();
    assert!(main.contains(".SH \"EXIT STATUS\""), "{main}");
    for code in 0..=5 {
        assert!(
            main.contains(&format!("\\fB{code}\\fR")),
            "exit {code} missing"
        );
    }
    let mut named = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        // roff writes a hyphen as `\-`.
        let text = std::fs::read_to_string(entry.unwrap().path())
            .unwrap()
            .replace("\\-", "-");
        let re_page = |t: &str| -> Vec<String> {
            t.split(|c: char| c.is_whitespace() || c == '\\')
                .filter_map(|w| w.strip_prefix("fleet").map(|r| format!("fleet{r}")))
                .filter_map(|w| w.split_once("(1)").map(|(p, _)| p.to_string()))
                .collect()
        };
        named.extend(re_page(&text));
    }
    assert!(named.contains("fleet-retire-plan"), "{named:?}");
    for page in &named {
        let file = dir.path().join(format!("{page}.1"));
        assert!(file.is_file(), "{page}(1) is named but not written");
    }
    // The page a user reads: man renders it.
    let shown = Command::new("man")
        .arg("-l")
        .arg(dir.path().join("fleet-retire-plan.1"))
        .env("MANPAGER", "cat")
        .output();
    if let Some(shown) = shown.ok().filter(|o| o.status.success()) {
        assert!(String::from_utf8_lossy(&shown.stdout).contains("EXIT STATUS"));
    }
}
