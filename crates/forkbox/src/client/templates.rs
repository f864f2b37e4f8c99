//! Custom templates on the server: `forkbox template build PATH` (a recipe
//! file, built by the server while its NDJSON stream is shown), `list`,
//! `show` and `rm`.

use std::io::IsTerminal;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};
use indicatif::{HumanBytes, ProgressBar, ProgressStyle};
use protocol::{BuildEvent, TemplateInfo};

use super::{delete_each, ndjson, Api};
use crate::ClientArgs;

/// Sends the recipe file at `path` to `POST /v1/templates` and shows the
/// build: a line per step and the build's output, a progress bar when
/// stderr is a terminal, and a summary line on stdout at the end.
pub async fn build(args: &ClientArgs, path: &Path) -> anyhow::Result<i32> {
    let recipe = crate::recipe_file::load(path)?;
    let api = Api::new(args);
    let resp = api.req(reqwest::Method::POST, "/v1/templates").json(&recipe).send().await.context("connect to the server")?;
    let resp = Api::check(resp).await.with_context(|| format!("build template `{}`", recipe.name))?;
    let view = BuildView::new(&recipe.name);
    let mut built = None;
    let streamed = ndjson(resp, |ev: BuildEvent| {
        match ev {
            BuildEvent::Step { index, total, step, cached } => view.step(index, total, &step, cached),
            BuildEvent::Log { stream, text } => view.log(&stream, &text),
            BuildEvent::Done { template } => built = Some(template),
            BuildEvent::Error { error } => bail!("build of template `{}` failed: {error}", recipe.name),
        }
        Ok(())
    })
    .await;
    view.finish(built.is_some() && streamed.is_ok());
    streamed?;
    let t = built.with_context(|| format!("build of template `{}`: the server ended its answer without a result", recipe.name))?;
    println!("{}", summary(&t));
    Ok(0)
}

/// `built template ml: 4 layers, 231.50 MiB, on python-datasci`.
fn summary(t: &TemplateInfo) -> String {
    let base = t.base.as_deref().map(|b| format!(", on {b}")).unwrap_or_default();
    let layers = if t.layers == 1 { "layer" } else { "layers" };
    format!("built template {}: {} {layers}, {}{base}", t.name, t.layers, HumanBytes(t.size_bytes))
}

/// What the user sees of a build. Step lines and logs are printed whether
/// or not there is a bar (above it while it is drawn), so a build piped to
/// a file or CI log reads the same, less the bar.
struct BuildView {
    bar: Option<ProgressBar>,
}

impl BuildView {
    fn new(name: &str) -> BuildView {
        let bar = std::io::stderr().is_terminal().then(|| {
            let style = ProgressStyle::with_template("{prefix:.bold} {elapsed:>4} [{bar:30.cyan/blue}] {wide_msg}")
                .expect("progress template is valid")
                .progress_chars("=> ");
            let bar = ProgressBar::new(1).with_style(style).with_prefix(name.to_string()).with_message("sending the recipe");
            // Keeps the elapsed time ticking through long silent steps.
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        BuildView { bar }
    }

    fn step(&self, index: u32, total: u32, step: &str, cached: bool) {
        let cached = if cached { " (cached)" } else { "" };
        let line = format!("step {index}/{total}{cached}: {step}");
        self.above(|| eprintln!("{line}"));
        if let Some(bar) = &self.bar {
            bar.set_length(u64::from(total.max(1)));
            bar.set_position(u64::from(index.saturating_sub(1)));
            bar.set_message(format!("{index}/{total}{cached} {}", step.lines().next().unwrap_or_default()));
        }
    }

    /// The running step's output: its stderr to stderr, the rest to stdout.
    fn log(&self, stream: &str, text: &str) {
        let text = text.strip_suffix('\n').unwrap_or(text);
        self.above(|| match stream {
            "stderr" => eprintln!("{text}"),
            _ => println!("{text}"),
        });
    }

    fn above(&self, print: impl FnOnce()) {
        match &self.bar {
            Some(bar) => bar.suspend(print),
            None => print(),
        }
    }

    /// Removes the bar; a finished build's is shown full first.
    fn finish(self, ok: bool) {
        if let Some(bar) = self.bar {
            if ok {
                bar.set_position(bar.length().unwrap_or(0));
            }
            bar.finish_and_clear();
        }
    }
}

/// `forkbox template list`: the server's templates as a table.
pub async fn list(args: &ClientArgs) -> anyhow::Result<i32> {
    let api = Api::new(args);
    let resp = api.req(reqwest::Method::GET, "/v1/templates").send().await.context("connect to the server")?;
    let list: Vec<TemplateInfo> = Api::check(resp).await?.json().await.context("read the template list")?;
    print!("{}", table(&list));
    Ok(0)
}

fn table(list: &[TemplateInfo]) -> String {
    let row = |cells: [&str; 7]| {
        let [name, kind, state, base, layers, size, used] = cells;
        format!("{name:<24} {kind:<8} {state:<14} {base:<20} {layers:>6} {size:>11} {used:>6}\n")
    };
    let mut out = row(["NAME", "KIND", "STATE", "BASE", "LAYERS", "SIZE", "IN_USE"]);
    for t in list {
        let state = if t.state == "building" { format!("building {:.0}%", t.progress * 100.0) } else { t.state.clone() };
        let used = t.in_use.sandboxes.len() + t.in_use.spaces.len() + t.in_use.templates.len();
        let kind = if t.kind.is_empty() { "-" } else { &t.kind };
        out += &row([&t.name, kind, &state, t.base.as_deref().unwrap_or("-"), &t.layers.to_string(), &HumanBytes(t.size_bytes).to_string(), &used.to_string()]);
    }
    out
}

/// `forkbox template show NAME`: the server's JSON for it, pretty, as is.
pub async fn show(args: &ClientArgs, name: &str) -> anyhow::Result<i32> {
    let api = Api::new(args);
    let resp = api.req(reqwest::Method::GET, &format!("/v1/templates/{name}")).send().await.context("connect to the server")?;
    let info: serde_json::Value = Api::check(resp).await.with_context(|| format!("template `{name}`"))?.json().await?;
    println!("{}", serde_json::to_string_pretty(&info)?);
    Ok(0)
}

/// `forkbox template rm NAME... [--force]`.
pub async fn rm(args: &ClientArgs, names: &[String], force: bool) -> anyhow::Result<i32> {
    let query = if force { "?force=true" } else { "" };
    let hint = " (--force deletes it anyway)";
    delete_each(&Api::new(args), names, |name| format!("/v1/templates/{name}{query}"), hint).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::{TemplateRecipe, TemplateUse};

    /// A server whose `POST /v1/templates` answers the recipe named `ok`
    /// with a build that succeeds, `fails` with one that fails, `cut` with
    /// a stream that ends early, and any other with a 409.
    async fn fake_server() -> ClientArgs {
        use axum::http::StatusCode;
        async fn post(axum::Json(r): axum::Json<TemplateRecipe>) -> (StatusCode, String) {
            let line = |ev: BuildEvent| serde_json::to_string(&ev).unwrap() + "\n";
            let mut body = line(BuildEvent::Step { index: 1, total: 2, step: "apt: jq".into(), cached: true });
            body += &line(BuildEvent::Log { stream: "stdout".into(), text: "hello\n".into() });
            match r.name.as_str() {
                "ok" => {
                    assert_eq!(r.files[0].content_b64, "QQ==");
                    let template = TemplateInfo { name: r.name, state: "ready".into(), layers: 2, ..Default::default() };
                    body += &line(BuildEvent::Done { template: Box::new(template) });
                }
                "fails" => body += &line(BuildEvent::Error { error: "apt-get exited with status 100".into() }),
                "cut" => {}
                _ => return (StatusCode::CONFLICT, r#"{"error": "template `taken` exists"}"#.into()),
            }
            // The last line without its newline still counts.
            (StatusCode::OK, body.trim_end().to_string())
        }
        let app = axum::Router::new().route("/v1/templates", axum::routing::post(post));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        ClientArgs { url, api_key: None }
    }

    #[tokio::test]
    async fn build_shows_the_stream_and_fails_with_its_error() {
        let server = fake_server().await;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), "A").unwrap();
        let recipe = |name: &str| {
            let path = dir.path().join(format!("{name}.toml"));
            std::fs::write(&path, format!("name = \"{name}\"\n[[files]]\nsrc = \"a\"\npath = \"/a\"\n")).unwrap();
            path
        };
        assert_eq!(build(&server, &recipe("ok")).await.unwrap(), 0);
        let e = format!("{:#}", build(&server, &recipe("fails")).await.unwrap_err());
        assert_eq!(e, "build of template `fails` failed: apt-get exited with status 100");
        let e = format!("{:#}", build(&server, &recipe("cut")).await.unwrap_err());
        assert!(e.contains("ended its answer without a result"), "{e}");
        let e = format!("{:#}", build(&server, &recipe("taken")).await.unwrap_err());
        assert_eq!(e, "build template `taken`: 409 Conflict: template `taken` exists");
    }

    #[test]
    fn summary_line() {
        let t = TemplateInfo { name: "ml".into(), layers: 4, size_bytes: 3 << 20, base: Some("python-datasci".into()), ..Default::default() };
        assert_eq!(summary(&t), "built template ml: 4 layers, 3.00 MiB, on python-datasci");
        let t = TemplateInfo { name: "x".into(), layers: 1, size_bytes: 10, ..Default::default() };
        assert_eq!(summary(&t), "built template x: 1 layer, 10 B");
    }

    #[test]
    fn list_table() {
        let list = [
            TemplateInfo { name: "default".into(), kind: "builtin".into(), state: "ready".into(), layers: 1, size_bytes: 1 << 30, ..Default::default() },
            TemplateInfo {
                name: "ml".into(),
                kind: "recipe".into(),
                state: "building".into(),
                progress: 0.42,
                base: Some("default".into()),
                layers: 3,
                in_use: TemplateUse { sandboxes: vec!["a".into(), "b".into()], spaces: vec![], templates: vec!["c".into()] },
                ..Default::default()
            },
        ];
        let out = table(&list);
        let lines: Vec<Vec<&str>> = out.lines().map(|l| l.split_whitespace().collect()).collect();
        assert_eq!(lines[0], ["NAME", "KIND", "STATE", "BASE", "LAYERS", "SIZE", "IN_USE"]);
        assert_eq!(lines[1], ["default", "builtin", "ready", "-", "1", "1.00", "GiB", "0"]);
        assert_eq!(lines[2], ["ml", "recipe", "building", "42%", "default", "3", "0", "B", "3"]);
    }
}
