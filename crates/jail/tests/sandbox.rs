//! The engine against real sandboxes: namespaces, mounts, limits, cleanup.

mod common;

use common::*;

#[tokio::test(flavor = "multi_thread")]
async fn bash_runs_inside_as_root_with_its_own_hostname() {
    let jail = jail();
    let sb = jail.create(spec("t-bash")).await.expect("create");
    let (code, out, err) = bash(&sb, "id -u; hostname; pwd; echo $HOME; ls /proc | grep -cE '^[0-9]+$'").await;
    assert_eq!(code, 0, "stderr: {err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "0");
    assert_eq!(lines[1], "t-bash");
    assert_eq!(lines[2], "/root");
    jail.destroy(&sb).await.expect("destroy");
}
