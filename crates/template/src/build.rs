//! The steps that turn a recipe into a rootfs directory.

use std::path::{Path, PathBuf};

use crate::error::TemplateError;
use crate::progress::Progress;
use crate::recipe::Recipe;
use crate::steps::Steps;
use crate::tools::{self, Tools};
use crate::{apt, chroot, debootstrap, exec, lock};

/// Lines of debootstrap's own log added to its error; its stdout rarely says why.
const DEBOOTSTRAP_LOG_LINES: usize = 20;

/// Command text shown in step names.
const STEP_COMMAND_CHARS: usize = 60;

/// The built base a derived template starts from.
pub(crate) struct Base {
    pub rootfs: PathBuf,
    /// Held shared while copying so the base can't be removed underneath us.
    pub lock: PathBuf,
}

/// Builds `recipe` into `rootfs`, which must not exist yet.
pub(crate) fn run(recipe: &Recipe, tools: &Tools, rootfs: &Path, base: Option<&Base>, progress: &dyn Progress) -> Result<(), TemplateError> {
    let name = recipe.name.as_str();
    // Each run command, then the final cleanup.
    let later = recipe.run.len() as u64 + 1;
    let mut steps = match base {
        None => {
            let mut tracker = debootstrap::Tracker::new(recipe, later);
            let mut steps = Steps::begin(progress, name, tracker.initial_steps() + later);
            steps.message("debootstrap: starting");
            let cmd = debootstrap::command(tools, recipe, rootfs);
            exec::run_step(name, "debootstrap", cmd, |line| tracker.line(&mut steps, line)).map_err(|e| with_debootstrap_log(e, rootfs))?;
            steps
        }
        Some(base) => {
            let mut tracker = apt::Tracker::new(recipe.apt.len(), later);
            let apt_steps = if recipe.apt.is_empty() { 0 } else { tracker.initial_steps() };
            let mut steps = Steps::begin(progress, name, 1 + apt_steps + later);
            copy_base(name, tools, base, rootfs, &mut steps)?;
            if !recipe.apt.is_empty() {
                in_chroot(name, tools, rootfs, |tools| {
                    let cmd = chroot::command(tools, rootfs, &apt::install_script(&recipe.apt));
                    exec::run_step(name, "apt-get install", cmd, |line| tracker.line(&mut steps, line))
                })?;
            }
            steps
        }
    };
    in_chroot(name, tools, rootfs, |tools| {
        for (i, command) in recipe.run.iter().enumerate() {
            let step = format!("run step {} (`{}`)", i + 1, summary(command));
            steps.message(&step);
            let cmd = chroot::command(tools, rootfs, command);
            exec::run_step(name, &step, cmd, |line| steps.message(line))?;
            steps.advance(&format!("{step} done"));
        }
        Ok(())
    })?;
    steps.advance("finished");
    Ok(())
}

/// Runs chroot steps with the rootfs prepared for them, and always undoes that.
fn in_chroot(name: &str, tools: &Tools, rootfs: &Path, f: impl FnOnce(&Tools) -> Result<(), TemplateError>) -> Result<(), TemplateError> {
    chroot::prepare(rootfs)?;
    let result = f(tools);
    let finished = chroot::finish(rootfs);
    tracing::debug!(template = name, ok = result.is_ok(), "chroot steps done");
    result.and(finished)
}

fn copy_base(name: &str, tools: &Tools, base: &Base, rootfs: &Path, steps: &mut Steps<'_>) -> Result<(), TemplateError> {
    steps.message("copying base template");
    let _lock = lock::shared(&base.lock)?;
    if !base.rootfs.is_dir() {
        return Err(TemplateError::io(format!("copying base {}", base.rootfs.display()))(std::io::ErrorKind::NotFound.into()));
    }
    // Reflinks make this near-free on btrfs/xfs; elsewhere it is a plain copy.
    let mut cmd = tools::command(&tools.cp);
    cmd.args(["-a", "--reflink=auto", "--"]).arg(&base.rootfs).arg(rootfs);
    exec::run_step(name, "copying base template", cmd, |_| {})?;
    steps.advance("copied base template");
    Ok(())
}

/// Adds the end of `<rootfs>/debootstrap/debootstrap.log` to a debootstrap
/// failure, since the partial rootfs holding it is removed.
fn with_debootstrap_log(error: TemplateError, rootfs: &Path) -> TemplateError {
    let TemplateError::StepFailed { template, step, status, mut tail } = error else {
        return error;
    };
    if let Ok(log) = std::fs::read(rootfs.join("debootstrap/debootstrap.log")) {
        let log = String::from_utf8_lossy(&log);
        let lines: Vec<&str> = log.lines().collect();
        let start = lines.len().saturating_sub(DEBOOTSTRAP_LOG_LINES);
        tail.push_str("\n--- end of debootstrap.log ---\n");
        tail.push_str(&lines[start..].join("\n"));
    }
    TemplateError::StepFailed { template, step, status, tail }
}

/// First line of a command, shortened, for step names.
fn summary(command: &str) -> String {
    let first = command.trim().lines().next().unwrap_or_default();
    let mut short: String = first.chars().take(STEP_COMMAND_CHARS).collect();
    if short.len() < command.trim().len() {
        short.push_str("...");
    }
    short
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_shortens_long_and_multi_line_commands() {
        assert_eq!(summary("apt-get clean"), "apt-get clean");
        assert_eq!(summary("echo a\necho b"), "echo a...");
        assert_eq!(summary(&"x".repeat(100)), format!("{}...", "x".repeat(STEP_COMMAND_CHARS)));
    }
}
