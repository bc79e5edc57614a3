use super::*;
use std::os::unix::fs::PermissionsExt;

const REG: &str = "registryfp-00112233445566778899aabbccddeeff";
const CAND: &str = "candidatefp-00112233445566778899aabbccddeeff";

fn rows() -> PlannedRows {
    PlannedRows {
        registry_fingerprint: REG.into(),
        rows: Vec::new(),
    }
}

/// A server's binding: the built-in-like policy set, one registry, the
/// controller's profile, bound to `repository`.
fn made_by(repository: &str) -> MadeBy {
    MadeBy {
        policy_fingerprint: "sha256:aa".into(),
        registry: "sqlite /fleet/registry.sqlite (device 1, inode 2)".into(),
        canonical_repository: repository.into(),
        profile: "controller-prgs".into(),
    }
}

fn ours() -> Found {
    Found::Ours(Arc::new(rows()))
}

/// The one file of the plan of [`REG`] and [`CAND`] in `dir`.
fn kept_file(dir: &Path) -> PathBuf {
    let names: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains(&format!("{REG}.{CAND}.")))
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
    names[0].clone()
}

/// A plan's rows written by one server are read by the next, for the
/// same tokens and binding only.
#[test]
fn a_kept_plan_is_found_by_both_tokens_and_the_binding() {
    let root = tempfile::tempdir().unwrap();
    let path = root.path().join("plans");
    PlanDir::open(&path, made_by("prgs/a"))
        .unwrap()
        .save(CAND, &rows());
    let next = PlanDir::open(&path, made_by("prgs/a")).unwrap();
    assert_eq!(next.load(REG, CAND), ours());
    let other_candidates = CAND.replace("00112233", "99999999");
    assert_eq!(next.load(REG, &other_candidates), Found::Nothing);
    assert_eq!(next.load("../../etc/passwd", CAND), Found::Nothing);
    let mode = std::fs::metadata(kept_file(&path))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}

/// A host-scoped plan's rows are kept too (issue 54: `serve` plans this
/// host's scope by default), under a name without the tokens' colon, and
/// pruned as any kept plan; a scoped token beside a whole one names none.
#[test]
fn a_host_scoped_plan_is_kept_and_found_by_its_scoped_tokens() {
    let root = tempfile::tempdir().unwrap();
    let path = root.path().join("plans");
    let scoped = |t: &str| format!("{}{t}", crate::fingerprint::HOST_SCOPE);
    let (reg, cand) = (scoped(REG), scoped(CAND));
    let rows = PlannedRows {
        registry_fingerprint: reg.clone(),
        rows: Vec::new(),
    };
    let dir = PlanDir::open(&path, made_by("prgs/a")).unwrap();
    dir.save(&cand, &rows);
    let next = PlanDir::open(&path, made_by("prgs/a")).unwrap();
    assert_eq!(next.load(&reg, &cand), Found::Ours(Arc::new(rows)));
    assert_eq!(next.load(REG, CAND), Found::Nothing);
    assert_eq!(next.load(&reg, CAND), Found::Nothing);
    let names: Vec<String> = std::fs::read_dir(&path)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
    assert!(names[0].starts_with(&format!("host-scope-{REG}.host-scope-{CAND}.")));
    assert!(super::prune::is_kept_plan(&names[0]));
}

/// Finding 50.7: a kept plan was matched by its tokens and repository
/// only. A plan made under another policy set, registry, repository or
/// profile is now found as made elsewhere, naming what differs; each
/// binding's plan of the same tokens is kept apart from the others'.
#[test]
fn a_plan_made_under_another_binding_is_found_as_made_elsewhere() {
    let root = tempfile::tempdir().unwrap();
    let path = root.path().join("plans");
    let mine = PlanDir::open(&path, made_by("prgs/a")).unwrap();
    type Set = fn(&mut MadeBy, &str);
    let others: [(&str, &str, Set); 4] = [
        ("policy set", "sha256:bb", |m, v| {
            m.policy_fingerprint = v.into()
        }),
        ("registry", "sqlite /elsewhere.sqlite", |m, v| {
            m.registry = v.into()
        }),
        ("canonical repository", "prgs/b", |m, v| {
            m.canonical_repository = v.into()
        }),
        ("profile", "planner-prgs", |m, v| m.profile = v.into()),
    ];
    for (what, value, set) in others {
        let mut theirs = made_by("prgs/a");
        set(&mut theirs, value);
        PlanDir::open(&path, theirs).unwrap().save(CAND, &rows());
        match mine.load(REG, CAND) {
            Found::Elsewhere(words) => {
                assert!(words.contains(what) && words.contains(value), "{words}")
            }
            found => panic!("{what}: {found:?}"),
        }
        std::fs::remove_file(kept_file(&path)).unwrap();
    }
    // Two bindings' plans of one pair of tokens live side by side.
    let mut planner = made_by("prgs/a");
    planner.profile = "planner-prgs".into();
    PlanDir::open(&path, planner.clone())
        .unwrap()
        .save(CAND, &rows());
    mine.save(CAND, &rows());
    assert_eq!(mine.load(REG, CAND), ours());
    assert_eq!(
        PlanDir::open(&path, planner).unwrap().load(REG, CAND),
        ours()
    );
}

/// A file renamed to this binding's name that another binding wrote is
/// not taken for this binding's: what it records is compared, not its name.
#[test]
fn a_file_under_this_bindings_name_must_record_this_binding() {
    let root = tempfile::tempdir().unwrap();
    let path = root.path().join("plans");
    let mine = PlanDir::open(&path, made_by("prgs/a")).unwrap();
    let mut planner = made_by("prgs/a");
    planner.profile = "planner-prgs".into();
    PlanDir::open(&path, planner).unwrap().save(CAND, &rows());
    let theirs = kept_file(&path);
    std::fs::rename(&theirs, path.join(mine.name(REG, CAND).unwrap())).unwrap();
    assert_eq!(mine.load(REG, CAND), Found::Nothing);
}

/// A folder open to others, or a link, is refused.
#[test]
fn a_folder_open_to_others_or_a_link_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let open = root.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert!(PlanDir::open(&open, made_by("prgs/a"))
        .unwrap_err()
        .contains("open to others"));
    let private = root.path().join("private");
    PlanDir::open(&private, made_by("prgs/a")).unwrap();
    let link = root.path().join("link");
    std::os::unix::fs::symlink(&private, &link).unwrap();
    assert!(PlanDir::open(&link, made_by("prgs/a")).is_err());
}

/// Found by the independent review: the folder was reached through its
/// path at every use, so one renamed away and replaced by a folder of
/// forged plans was followed. The folder held open is the one used.
#[test]
fn a_folder_replaced_after_it_was_opened_is_never_followed() {
    let root = tempfile::tempdir().unwrap();
    let path = root.path().join("plans");
    let dir = PlanDir::open(&path, made_by("prgs/a")).unwrap();
    std::fs::rename(&path, root.path().join("moved")).unwrap();
    std::fs::create_dir(&path).unwrap();
    let binding = made_by("prgs/a");
    let empty = rows();
    let forged = file::Writing::new(CAND, &binding, &empty);
    std::fs::write(
        path.join(dir.name(REG, CAND).unwrap()),
        serde_json::to_vec(&forged).unwrap(),
    )
    .unwrap();
    assert_eq!(dir.load(REG, CAND), Found::Nothing);
    dir.save(CAND, &rows());
    assert!(root
        .path()
        .join("moved")
        .join(dir.name(REG, CAND).unwrap())
        .is_file());
}

/// A link in the folder in place of a kept plan is not followed.
#[test]
fn a_link_in_place_of_a_kept_plan_is_ignored() {
    let root = tempfile::tempdir().unwrap();
    let path = root.path().join("plans");
    let dir = PlanDir::open(&path, made_by("prgs/a")).unwrap();
    let elsewhere = root.path().join("elsewhere.json");
    dir.save(CAND, &rows());
    let name = path.join(dir.name(REG, CAND).unwrap());
    std::fs::rename(&name, &elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &name).unwrap();
    assert_eq!(dir.load(REG, CAND), Found::Nothing);
}

/// The rows of a plan of the `i`th registry token.
fn plan_number(i: usize) -> (String, PlannedRows) {
    let registry = format!("registryfp-{i:032x}");
    let rows = PlannedRows {
        registry_fingerprint: registry.clone(),
        rows: Vec::new(),
    };
    (registry, rows)
}

/// Finding 50.8: the folder was listed through its path, so once it was
/// renamed away the server holding it wrote into it and never pruned it
/// (40 plans left 40 files). It is listed through the descriptor held.
#[test]
fn a_folder_renamed_away_is_still_pruned_to_its_bound() {
    let root = tempfile::tempdir().unwrap();
    let path = root.path().join("plans");
    let dir = PlanDir::open(&path, made_by("prgs/a")).unwrap();
    let moved = root.path().join("moved");
    std::fs::rename(&path, &moved).unwrap();
    for i in 0..KEEP_FILES + 8 {
        let (_, rows) = plan_number(i);
        dir.save(CAND, &rows);
    }
    let left = std::fs::read_dir(&moved).unwrap().count();
    assert_eq!(left, KEEP_FILES);
    assert!(!path.exists());
}

/// A temporary file as a writer leaves it: created, written in part,
/// unlocked (the kernel drops a dead writer's lock), unchanged for `age`.
fn plant_temporary(dir: &Path, age: std::time::Duration) -> PathBuf {
    let (registry, _) = plan_number(999);
    let file = dir.join(format!(".{registry}.{CAND}.json.4242.tmp"));
    std::fs::write(&file, b"{\"registry_fingerprint\": \"regis").unwrap();
    let then = std::time::SystemTime::now() - age;
    std::fs::File::options()
        .write(true)
        .open(&file)
        .unwrap()
        .set_modified(then)
        .unwrap();
    file
}

/// Finding 50.8: a server killed while writing left its temporary file
/// for ever, which neither the count nor the age limit removed. A
/// temporary file unchanged for [`TEMPORARY_STALE`] that no live writer
/// holds is now removed; a live writer's (locked), and a fresh one, are
/// left alone.
#[test]
fn a_temporary_file_a_dead_writer_left_is_pruned_and_a_live_writers_is_not() {
    let root = tempfile::tempdir().unwrap();
    let path = root.path().join("plans");
    let dir = PlanDir::open(&path, made_by("prgs/a")).unwrap();
    let hour = std::time::Duration::from_secs(3600);
    let abandoned = plant_temporary(&path, hour);
    dir.save(CAND, &rows());
    assert!(!abandoned.exists(), "a dead writer's temporary file stayed");

    // A writer that is alive holds its lock, however old its file looks.
    let writing = plant_temporary(&path, hour);
    let held = Flock::lock(
        std::fs::File::open(&writing).unwrap(),
        FlockArg::LockExclusiveNonblock,
    )
    .unwrap();
    dir.save(CAND, &rows());
    assert!(
        writing.exists(),
        "a live writer's temporary file was removed"
    );
    drop(held);
    // Just created and not yet locked: left alone too.
    std::fs::remove_file(&writing).unwrap();
    let fresh = plant_temporary(&path, std::time::Duration::ZERO);
    dir.save(CAND, &rows());
    assert!(fresh.exists(), "a fresh temporary file was removed");
    // Nothing else is left of the writes: one kept plan and the fresh file.
    assert_eq!(std::fs::read_dir(&path).unwrap().count(), 2);
}

/// The `i`th plan with `n` rows of about 200 bytes each in its file.
fn plan_of_rows(i: usize, n: usize) -> (String, PlannedRows) {
    let (registry, mut rows) = plan_number(i);
    rows.rows = (0..n)
        .map(|r| crate::plan::planned::PlannedRow {
            worker_identity: format!("w-{r:0>64}"),
            row_digest: r as u128,
            digest_without_heartbeat: r as u128,
            live: false,
            reason_codes: Some(vec!["already_terminal_registration".to_string()].into()),
            peers: None,
        })
        .collect();
    (registry, rows)
}

/// The bytes of the kept plans in `dir`, and how many there are.
fn kept_bytes(dir: &Path) -> (u64, usize) {
    let sizes: Vec<u64> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().starts_with("registryfp-"))
        .map(|e| e.metadata().unwrap().len())
        .collect();
    (sizes.iter().sum(), sizes.len())
}

/// Issue 52: 32 plans of 100,000 rows took a gigabyte. The folder is
/// bounded in bytes too, the oldest plans going first; the plan just
/// written stays (the next server's apply needs it) even when it alone is
/// over the bound.
#[test]
fn the_folder_is_bounded_in_bytes_and_keeps_the_plan_just_written() {
    let root = tempfile::tempdir().unwrap();
    let path = root.path().join("plans");
    let dir = PlanDir::open(&path, made_by("prgs/a"))
        .unwrap()
        .with_max_bytes(100_000);
    for i in 0..10 {
        let (_, rows) = plan_of_rows(i, 120);
        dir.save(CAND, &rows);
        let (bytes, files) = kept_bytes(&path);
        assert!(bytes <= 100_000, "{bytes} bytes in {files} files");
        // About 23 KB a plan: the count bound (32) is not what stops it.
        assert_eq!(files, (i + 1).min(4), "{bytes} bytes");
    }
    let (newest, rows) = plan_of_rows(9, 120);
    assert_eq!(dir.load(&newest, CAND), Found::Ours(Arc::new(rows)));
    let (oldest, _) = plan_of_rows(0, 120);
    assert_eq!(dir.load(&oldest, CAND), Found::Nothing);
    // A plan larger than the bound by itself: kept, alone.
    let (large, rows) = plan_of_rows(10, 2_000);
    dir.save(CAND, &rows);
    assert_eq!(kept_bytes(&path).1, 1);
    assert_eq!(dir.load(&large, CAND), Found::Ours(Arc::new(rows)));
    assert!(
        dir.describe().contains("at most 0.1 MiB"),
        "{}",
        dir.describe()
    );
}
