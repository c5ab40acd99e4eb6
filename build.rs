//! Names the commit the binaries are built from, for `--version`: `git rev-parse HEAD` in a
//! checkout, else KUBE_OBJECT_LOCK_COMMIT (a build from an exported tree, an image build
//! without `.git/`), else "unknown". Re-run only when HEAD moves, not at every source change.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (out.status.success() && !text.is_empty()).then(|| text.to_owned())
}

fn rerun_if_changed(git_path: &str) {
    if let Some(path) = git(&["rev-parse", "--git-path", git_path])
        && Path::new(&path).exists()
    {
        println!("cargo:rerun-if-changed={path}");
    }
}

fn main() {
    println!("cargo:rerun-if-env-changed=KUBE_OBJECT_LOCK_COMMIT");
    let given = std::env::var("KUBE_OBJECT_LOCK_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty());
    let commit = given.or_else(|| {
        // HEAD, the branch it names and packed-refs: a commit or a checkout changes one of them.
        rerun_if_changed("HEAD");
        if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
            rerun_if_changed(&branch);
        }
        rerun_if_changed("packed-refs");
        git(&["rev-parse", "--short=12", "HEAD"])
    });
    println!(
        "cargo:rustc-env=KUBE_OBJECT_LOCK_COMMIT={}",
        commit.as_deref().unwrap_or("unknown")
    );
}
