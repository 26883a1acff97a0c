//! The repository store against real git repositories.

use std::path::Path;

use cachet_context::testing::TestRepo;
use cachet_context::{ChangeKind, CommitId, ContextError, Mirror, RepoStore, Source, SourcePolicy};

struct Fixture {
    _dir: tempfile::TempDir,
    root: std::path::PathBuf,
    store: RepoStore,
}

fn fixture(allow_remote: bool) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("repos");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(dir.path().join("data")).unwrap();
    let policy = SourcePolicy {
        allowed_root: Some(root.clone()),
        allow_remote,
        private_dirs: vec![dir.path().join("data")],
        ..SourcePolicy::default()
    };
    let store = RepoStore::new(dir.path().join("mirrors"), policy).unwrap();
    Fixture { root: root.canonicalize().unwrap(), store, _dir: dir }
}

fn is_bad_source(r: Result<Source, ContextError>) -> bool {
    matches!(r, Err(ContextError::BadSource(_)))
}

#[test]
fn validate_accepts_local_paths_inside_the_root_and_file_urls() {
    let f = fixture(false);
    let repo = f.root.join("app");
    TestRepo::init(&repo).unwrap();
    assert_eq!(f.store.validate(repo.to_str().unwrap()).unwrap(), Source::Local(repo.clone()));
    let url = format!("file://{}", repo.display());
    assert_eq!(f.store.validate(&url).unwrap(), Source::Local(repo.clone()));
    // A `..` that stays inside the root is fine.
    let roundabout = format!("{}/app/../app", f.root.display());
    assert_eq!(f.store.validate(&roundabout).unwrap(), Source::Local(repo));
}

#[test]
fn validate_refuses_escapes_and_odd_sources() {
    let f = fixture(false);
    TestRepo::init(f.root.join("app")).unwrap();
    std::fs::create_dir_all(f.root.join("not-a-repo")).unwrap();
    let outside = f.root.parent().unwrap().join("outside");
    TestRepo::init(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, f.root.join("link")).unwrap();
    let mirrors = f.store.mirrors_dir().to_path_buf();
    let cases = [
        outside.display().to_string(),
        format!("{}/app/../../outside", f.root.display()),
        format!("{}/link", f.root.display()),
        format!("file://{}", outside.display()),
        mirrors.display().to_string(),
        "/etc".to_string(),
        "relative/path".to_string(),
        format!("{}/missing", f.root.display()),
        format!("{}/not-a-repo", f.root.display()),
        "ext::sh -c touch% /tmp/pwned".to_string(),
        "fd::17".to_string(),
        "-uhelp".to_string(),
        "--upload-pack=touch /tmp/x".to_string(),
        String::new(),
        "   ".to_string(),
        format!("{}/app\n", f.root.display()),
        "https://github.com/a/b.git".to_string(),
        "git@github.com:a/b.git".to_string(),
        "ftp://host/repo".to_string(),
        "file://otherhost/repo".to_string(),
    ];
    for case in &cases {
        assert!(is_bad_source(f.store.validate(case)), "accepted {case:?}");
    }
}

#[test]
fn validate_refuses_local_paths_without_a_root() {
    let dir = tempfile::tempdir().unwrap();
    let store =
        RepoStore::new(dir.path().join("m"), SourcePolicy { allow_remote: true, ..SourcePolicy::default() }).unwrap();
    assert!(is_bad_source(store.validate(dir.path().to_str().unwrap())));
    assert!(is_bad_source(store.validate(&format!("file://{}", dir.path().display()))));
}

#[test]
fn validate_remote_urls_when_allowed() {
    let f = fixture(true);
    for ok in [
        "https://github.com/a/b.git",
        "http://host:8080/r",
        "ssh://git@host/r.git",
        "git://host/r",
        "git@github.com:a/b.git",
    ] {
        assert_eq!(f.store.validate(ok).unwrap(), Source::Remote(ok.to_string()), "{ok}");
    }
    for bad in ["ssh://-oProxyCommand=touch%20x/r", "https://", "https:// host/r", "ext::ssh host", "git@host:-x"] {
        assert!(is_bad_source(f.store.validate(bad)), "accepted {bad:?}");
    }
}

fn grown_repo(root: &Path) -> (TestRepo, Vec<CommitId>) {
    let repo = TestRepo::init(root.join("app")).unwrap();
    let c1 = repo.commit(&[("a.txt", Some("one\n")), ("src/lib.rs", Some("fn a() {}\n"))], "one").unwrap();
    let c2 = repo.commit(&[("a.txt", Some("two\n"))], "two").unwrap();
    (repo, vec![c1, c2])
}

#[test]
fn create_mirror_from_a_path_and_a_file_url() {
    let f = fixture(false);
    let (repo, commits) = grown_repo(&f.root);
    let source = f.store.validate(repo.path().to_str().unwrap()).unwrap();
    let m = f.store.create_mirror("app", &source).unwrap();
    assert_eq!(m.branch_head("main").unwrap(), commits[1]);
    // Idempotent.
    let again = f.store.create_mirror("app", &source).unwrap();
    assert_eq!(again.branch_head("refs/heads/main").unwrap(), commits[1]);
    assert_eq!(f.store.mirror("app").unwrap().branch_head("main").unwrap(), commits[1]);

    let url = format!("file://{}", repo.path().display());
    let m2 = f.store.create_mirror("app-2", &f.store.validate(&url).unwrap()).unwrap();
    assert_eq!(m2.branch_head("main").unwrap(), commits[1]);

    for bad_id in ["", "a/b", "../x", "a.b", &"x".repeat(65)] {
        assert!(matches!(f.store.create_mirror(bad_id, &source), Err(ContextError::BadSource(_))), "{bad_id:?}");
    }
    assert!(matches!(f.store.mirror("nope"), Err(ContextError::NotFound(_))));
    f.store.remove("app-2").unwrap();
    assert!(matches!(f.store.mirror("app-2"), Err(ContextError::NotFound(_))));
    assert!(matches!(f.store.remove("app-2"), Err(ContextError::NotFound(_))));
}

#[test]
fn a_failed_first_fetch_leaves_no_mirror() {
    let f = fixture(false);
    let (repo, _) = grown_repo(&f.root);
    let source = f.store.validate(repo.path().to_str().unwrap()).unwrap();
    // A repository whose objects are gone: the fetch fails.
    std::fs::remove_dir_all(repo.path().join(".git/objects")).unwrap();
    std::fs::create_dir_all(repo.path().join(".git/objects")).unwrap();
    let err = f.store.create_mirror("empty", &source).unwrap_err();
    assert!(matches!(err, ContextError::Fetch(_) | ContextError::Git(_)), "{err:?}");
    assert!(matches!(f.store.mirror("empty"), Err(ContextError::NotFound(_))));
}

#[test]
fn fetch_picks_up_new_commits_and_deleted_branches() {
    let f = fixture(false);
    let (repo, commits) = grown_repo(&f.root);
    repo.branch("feature", &commits[0]).unwrap();
    let m = f.store.create_mirror("app", &f.store.validate(repo.path().to_str().unwrap()).unwrap()).unwrap();
    assert_eq!(m.branch_head("feature").unwrap(), commits[0]);
    let c3 = repo.commit(&[("b.txt", Some("b\n"))], "three").unwrap();
    repo.delete_branch("feature").unwrap();
    assert!(!m.has_commit(&c3));
    m.fetch().unwrap();
    assert!(m.has_commit(&c3));
    assert_eq!(m.branch_head("main").unwrap(), c3);
    assert!(matches!(m.branch_head("feature"), Err(ContextError::UnknownRef(_))));
}

#[test]
fn branch_head_and_resolve() {
    let f = fixture(false);
    let (repo, commits) = grown_repo(&f.root);
    let m = Mirror::open_path(repo.path()).unwrap();
    assert_eq!(m.resolve("main").unwrap(), commits[1]);
    assert_eq!(m.resolve("HEAD").unwrap(), commits[1]);
    assert_eq!(m.resolve(&commits[0].0).unwrap(), commits[0]);
    assert_eq!(m.resolve(&commits[0].0[..10]).unwrap(), commits[0]);
    for bad in ["nope", "deadbeef", "", "-x", "main..x", "HEAD~1", "HEAD^", "a b", ":/one", "@"] {
        assert!(matches!(m.resolve(bad), Err(ContextError::UnknownRef(_))), "{bad:?}");
    }
    assert!(matches!(m.branch_head("nope"), Err(ContextError::UnknownRef(_))));
    assert!(matches!(m.branch_head("../main"), Err(ContextError::UnknownRef(_))));
    // A blob id is not a commit.
    let blob = m.read_file(&commits[1], "a.txt").unwrap().unwrap().blob;
    assert!(matches!(m.resolve(&blob.0), Err(ContextError::UnknownRef(_))));
    assert!(!m.has_commit(&CommitId("0".repeat(40))));
    assert!(!m.has_commit(&CommitId("garbage".into())));
    assert!(matches!(Mirror::open_path(&f.root.join("nothing")), Err(ContextError::NotFound(_))));
    let empty = TestRepo::init(f.root.join("empty")).unwrap();
    let unborn = Mirror::open_path(empty.path()).unwrap();
    assert!(matches!(unborn.resolve("HEAD"), Err(ContextError::UnknownRef(_))));
}

#[test]
fn read_file_refuses_traversal() {
    let f = fixture(false);
    let (repo, commits) = grown_repo(&f.root);
    let m = Mirror::open_path(repo.path()).unwrap();
    let file = m.read_file(&commits[1], "src/lib.rs").unwrap().unwrap();
    assert_eq!(file.bytes, b"fn a() {}\n");
    assert_eq!(m.read_file(&commits[0], "a.txt").unwrap().unwrap().bytes, b"one\n");
    assert_eq!(m.read_file(&commits[1], "missing.txt").unwrap(), None);
    assert_eq!(m.read_file(&commits[1], "src").unwrap(), None);
    for bad in ["../etc/passwd", "/etc/passwd", "src/../a.txt", "./a.txt", "", "src//lib.rs", "src\\lib.rs", "a\0b"] {
        assert!(matches!(m.read_file(&commits[1], bad), Err(ContextError::BadPath(_))), "{bad:?}");
    }
    assert!(matches!(m.read_file(&CommitId("1".repeat(40)), "a.txt"), Err(ContextError::NotFound(_))));
}

#[test]
fn changed_paths_add_modify_delete_rename() {
    let dir = tempfile::tempdir().unwrap();
    let repo = TestRepo::init(dir.path()).unwrap();
    let c1 =
        repo.commit(&[("keep.txt", Some("k\n")), ("old.txt", Some("o\n")), ("gone.txt", Some("g\n"))], "1").unwrap();
    let c2 = repo
        .commit(
            &[
                ("keep.txt", Some("k2\n")),
                ("old.txt", None),
                ("new.txt", Some("o\n")),
                ("gone.txt", None),
                ("d/add.txt", Some("a\n")),
            ],
            "2",
        )
        .unwrap();
    let m = Mirror::open_path(repo.path()).unwrap();
    let changes: Vec<(String, ChangeKind)> =
        m.changed_paths(&c1, &c2).unwrap().into_iter().map(|c| (c.path, c.kind)).collect();
    let expected = [
        ("d/add.txt", ChangeKind::Added),
        ("gone.txt", ChangeKind::Deleted),
        ("keep.txt", ChangeKind::Modified),
        ("new.txt", ChangeKind::Added),
        ("old.txt", ChangeKind::Deleted),
    ];
    assert_eq!(changes, expected.map(|(p, k)| (p.to_string(), k)));
    assert!(m.changed_paths(&c2, &c2).unwrap().is_empty());
}

#[test]
fn a_file_diff_is_its_hunks_against_the_earlier_commit() {
    let dir = tempfile::tempdir().unwrap();
    let repo = TestRepo::init(dir.path()).unwrap();
    let lines: String = (1..=20).map(|i| format!("line {i}\n")).collect();
    let c1 = repo.commit(&[("a.txt", Some(&lines)), ("b.txt", Some("b\n")), ("bin", Some("x\0y"))], "1").unwrap();
    let edited = lines.replace("line 10\n", "line ten\nline 10.5\n");
    let c2 = repo.commit(&[("a.txt", Some(&edited)), ("bin", Some("x\0z"))], "2").unwrap();
    let m = Mirror::open_path(repo.path()).unwrap();
    let diff = m.file_diff(&c1, &c2, "a.txt", 1).unwrap().unwrap();
    // The hunk header names the enclosing "function" line, as git does.
    assert_eq!(diff, "@@ -9,3 +9,4 @@ line 8\n line 9\n-line 10\n+line ten\n+line 10.5\n line 11\n");
    assert_eq!(m.file_diff(&c1, &c2, "b.txt", 1).unwrap(), None, "unchanged");
    assert_eq!(m.file_diff(&c1, &c2, "bin", 1).unwrap(), None, "binary");
    // A path is matched exactly, not as a pattern.
    assert_eq!(m.file_diff(&c1, &c2, "*.txt", 1).unwrap(), None);
}

#[test]
fn first_parent_follows_main_through_a_merge() {
    let dir = tempfile::tempdir().unwrap();
    let repo = TestRepo::init(dir.path()).unwrap();
    let c1 = repo.commit(&[("a", Some("1"))], "1").unwrap();
    let f1 = repo.commit_on("feature", &[("f", Some(b"1".as_slice()))], "f1", std::slice::from_ref(&c1)).unwrap();
    let f2 = repo.commit_on("feature", &[("f", Some(b"2".as_slice()))], "f2", &[]).unwrap();
    let c2 = repo.commit(&[("a", Some("2"))], "2").unwrap();
    let merge = repo.commit_on("main", &[("f", Some(b"2".as_slice()))], "merge", std::slice::from_ref(&f2)).unwrap();
    let c3 = repo.commit(&[("a", Some("3"))], "3").unwrap();
    let m = Mirror::open_path(repo.path()).unwrap();
    assert_eq!(m.first_parent(&c3, 10).unwrap(), vec![c3.clone(), merge, c2, c1]);
    assert_eq!(m.first_parent(&c3, 1).unwrap(), vec![c3.clone()]);
    assert!(m.first_parent(&c3, 0).unwrap().is_empty());
    assert_eq!(m.first_parent(&f2, 10).unwrap().len(), 3, "{f1}");
}

#[test]
fn test_repo_commit_ids_are_deterministic() {
    let ids: Vec<CommitId> = (0..2)
        .map(|_| {
            let dir = tempfile::tempdir().unwrap();
            let repo = TestRepo::init(dir.path()).unwrap();
            repo.commit(&[("a", Some("1"))], "1").unwrap();
            repo.commit(&[("b", Some("2"))], "2").unwrap()
        })
        .collect();
    assert_eq!(ids[0], ids[1]);
}

#[test]
fn corrupt_objects_are_errors_not_panics() {
    use cachet_context::{ContextBuilder, ContextOptions, TokenCounter};
    struct Bytes;
    impl TokenCounter for Bytes {
        fn encode(&self, text: &str) -> Vec<u32> {
            text.bytes().map(u32::from).collect()
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let repo = TestRepo::init(dir.path()).unwrap();
    let head = repo.commit(&[("src/lib.rs", Some("pub fn a() {}\n")), ("b.txt", Some("b\n"))], "one").unwrap();
    let m = Mirror::open_path(repo.path()).unwrap();
    let blob = m.read_file(&head, "src/lib.rs").unwrap().unwrap().blob.0;
    let object = dir.path().join(".git/objects").join(&blob[..2]).join(&blob[2..]);
    std::fs::write(&object, b"garbage").unwrap();
    assert!(m.read_file(&head, "src/lib.rs").is_err());
    let built = ContextBuilder::new(10).build(&m, &head, &ContextOptions::default(), &Bytes);
    assert!(matches!(built, Err(ContextError::Git(_))), "{built:?}");
}

#[test]
fn shared_types_are_send_and_sync() {
    fn check<T: Send + Sync + Clone>() {}
    check::<RepoStore>();
    check::<Mirror>();
    check::<cachet_context::ContextBuilder>();
}

/// The victim: another tenant's mirror, holding a secret.
fn secret_mirror(f: &Fixture) -> (std::path::PathBuf, CommitId) {
    let victim = TestRepo::init(f.root.join("victim")).unwrap();
    let secret = victim.commit(&[("secret.txt", Some("TOP SECRET\n"))], "secret").unwrap();
    let source = f.store.validate(victim.path().to_str().unwrap()).unwrap();
    let mirror = f.store.create_mirror("victim", &source).unwrap();
    std::fs::remove_dir_all(victim.path()).unwrap();
    (mirror.path().canonicalize().unwrap(), secret)
}

/// A refusal's words with the path it names taken out.
fn refusal(f: &Fixture, path: &str) -> String {
    let shown = path.strip_prefix("file://").unwrap_or(path);
    match f.store.validate(path) {
        Err(ContextError::BadSource(m)) => m.replace(shown, "<path>"),
        other => panic!("{path}: not refused: {other:?}"),
    }
}

#[test]
fn local_sources_whose_git_data_leaves_the_root_are_refused_with_one_message() {
    let f = fixture(false);
    let (mirror, secret) = secret_mirror(&f);
    let write = |p: std::path::PathBuf, text: String| {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    let stolen_ref = |repo: &TestRepo| write(repo.path().join(".git/refs/heads/stolen"), format!("{}\n", secret.0));
    let mut attacks = Vec::new();

    // A `.git` file naming the mirror, and a `.git` symlink to it.
    write(f.root.join("gitdir-file/.git"), format!("gitdir: {}\n", mirror.display()));
    attacks.push(f.root.join("gitdir-file"));
    std::fs::create_dir_all(f.root.join("symlinked")).unwrap();
    std::os::unix::fs::symlink(&mirror, f.root.join("symlinked/.git")).unwrap();
    attacks.push(f.root.join("symlinked"));
    // A worktree whose common directory is the mirror.
    let wt_git = f.root.join("wt-git");
    write(wt_git.join("HEAD"), "ref: refs/heads/main\n".into());
    write(wt_git.join("commondir"), format!("{}\n", mirror.display()));
    write(wt_git.join("gitdir"), format!("{}/worktree/.git\n", f.root.display()));
    write(f.root.join("worktree/.git"), format!("gitdir: {}\n", wt_git.display()));
    attacks.push(f.root.join("worktree"));
    // Alternates: absolute, relative, and through another repository under the root.
    let absolute = TestRepo::init(f.root.join("alternates")).unwrap();
    absolute.commit(&[("a", Some("a"))], "a").unwrap();
    write(absolute.path().join(".git/objects/info/alternates"), format!("{}/objects\n", mirror.display()));
    stolen_ref(&absolute);
    attacks.push(absolute.path().to_path_buf());
    let relative = TestRepo::init(f.root.join("relative")).unwrap();
    let up = relative.path().join(".git/objects").canonicalize().unwrap();
    let hops = up.components().count() - 1;
    let back = format!("{}{}/objects\n", "../".repeat(hops), mirror.strip_prefix("/").unwrap().display());
    write(relative.path().join(".git/objects/info/alternates"), back);
    attacks.push(relative.path().to_path_buf());
    let chained = TestRepo::init(f.root.join("chained")).unwrap();
    write(chained.path().join(".git/objects/info/alternates"), format!("{}/.git/objects\n", absolute.path().display()));
    attacks.push(chained.path().to_path_buf());
    // A symlinked object store, and one symlinked pack file.
    let linked = TestRepo::init(f.root.join("objects-link")).unwrap();
    std::fs::remove_dir_all(linked.path().join(".git/objects")).unwrap();
    std::os::unix::fs::symlink(mirror.join("objects"), linked.path().join(".git/objects")).unwrap();
    stolen_ref(&linked);
    attacks.push(linked.path().to_path_buf());
    let one_pack = TestRepo::init(f.root.join("pack-link")).unwrap();
    let pack = std::fs::read_dir(mirror.join("objects/pack")).unwrap().next().unwrap().unwrap().path();
    let name = pack.file_name().unwrap();
    std::os::unix::fs::symlink(&pack, one_pack.path().join(".git/objects/pack").join(name)).unwrap();
    attacks.push(one_pack.path().to_path_buf());
    // The mirror itself, under a symlink inside the root.
    std::os::unix::fs::symlink(&mirror, f.root.join("mirror-link")).unwrap();
    attacks.push(f.root.join("mirror-link"));

    let words = refusal(&f, "/no/such/path");
    for attack in &attacks {
        let path = attack.display().to_string();
        assert_eq!(refusal(&f, &path), words, "{path}");
        assert_eq!(refusal(&f, &format!("file://{path}")), words, "file:// {path}");
    }
    // Whether a path outside the root exists is not told.
    let outside = f.root.parent().unwrap().join("exists-outside");
    TestRepo::init(&outside).unwrap();
    assert_eq!(refusal(&f, &outside.display().to_string()), words);
    assert_eq!(refusal(&f, "/etc"), words);
    assert_eq!(refusal(&f, &format!("{}/missing", f.root.display())), words);
}

#[test]
fn a_source_changed_after_its_registration_is_checked_again_before_each_fetch() {
    let f = fixture(false);
    let (mirror, _) = secret_mirror(&f);
    let (repo, _) = grown_repo(&f.root);
    let source = f.store.validate(repo.path().to_str().unwrap()).unwrap();
    let swap = || {
        std::fs::remove_dir_all(repo.path().join(".git")).unwrap();
        std::fs::write(repo.path().join(".git"), format!("gitdir: {}\n", mirror.display())).unwrap();
    };
    let m = f.store.create_mirror("app", &source).unwrap();
    swap();
    assert!(matches!(m.fetch(), Err(ContextError::BadSource(_))));
    assert!(matches!(f.store.create_mirror("app-2", &source), Err(ContextError::BadSource(_))));
    assert!(matches!(f.store.mirror("app-2"), Err(ContextError::NotFound(_))));
}

#[test]
fn worktrees_and_alternates_inside_the_root_are_sources() {
    let f = fixture(false);
    let (repo, commits) = grown_repo(&f.root);
    // A linked worktree (its `.git` is a file; the common directory is the main repository's).
    let git = git2::Repository::open(repo.path()).unwrap();
    git.worktree("wt", &f.root.join("wt"), None).unwrap();
    let wt = f.store.validate(f.root.join("wt").to_str().unwrap()).unwrap();
    assert_eq!(f.store.create_mirror("wt", &wt).unwrap().branch_head("main").unwrap(), commits[1]);
    // A repository borrowing its objects from another under the root (`git clone --shared`).
    let shared = TestRepo::init(f.root.join("shared")).unwrap();
    let objects = repo.path().join(".git/objects").canonicalize().unwrap();
    std::fs::write(shared.path().join(".git/objects/info/alternates"), format!("{}\n", objects.display())).unwrap();
    std::fs::write(shared.path().join(".git/refs/heads/main"), format!("{}\n", commits[0].0)).unwrap();
    let source = f.store.validate(shared.path().to_str().unwrap()).unwrap();
    assert_eq!(f.store.create_mirror("shared", &source).unwrap().branch_head("main").unwrap(), commits[0]);
}
