//! Code contexts: more persistent Python REPLs in one sandbox, each with
//! its own variables and working directory, all sharing the sandbox's files
//! and processes (E2B's code-interpreter contexts, docs/e2b.md#contexts).
//! The sandbox's own REPL is its default context; each other context's REPL
//! starts on its create and runs its execs in order, beside the others.

use std::sync::Arc;
use std::time::Duration;

use crate::error::Error;
use crate::keys::Caller;
use crate::sandbox::{ReplSlot, SandboxEntry};
use crate::state::Service;

/// Contexts per sandbox besides its own REPL (429 beyond).
pub const MAX_CONTEXTS: usize = 16;
/// How long a new context's REPL may take to start.
const START_TIMEOUT: Duration = Duration::from_secs(60);

pub struct Context {
    pub id: String,
    pub language: String,
    pub cwd: String,
    /// Executions run in it (E2B's `execution_count`).
    pub execs: std::sync::atomic::AtomicU64,
    pub(crate) slot: tokio::sync::Mutex<ReplSlot>,
}

/// A sandbox's extra contexts.
#[derive(Default)]
pub struct Contexts(std::sync::Mutex<Vec<Arc<Context>>>);

impl Contexts {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Context>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn get(&self, id: &str) -> Result<Arc<Context>, Error> {
        self.lock().iter().find(|c| c.id == id).cloned().ok_or_else(|| Error::NotFound(format!("context `{id}` not found")))
    }

    pub fn list(&self) -> Vec<Arc<Context>> {
        self.lock().clone()
    }
}

/// Python that moves a REPL to `cwd` (a JSON string is a Python literal).
fn chdir_code(cwd: &str) -> String {
    let quoted = serde_json::to_string(cwd).unwrap_or_else(|_| "'/'".into());
    format!("import os as _fb_os\n_fb_os.makedirs({quoted}, exist_ok=True)\n_fb_os.chdir({quoted})\ndel _fb_os\n")
}

impl Service {
    /// A new context in sandbox `id`, its REPL started in `cwd`.
    pub async fn create_context(&self, caller: &Caller, id: &str, language: &str, cwd: &str) -> Result<Arc<Context>, Error> {
        let entry = self.get(caller, id).await?;
        if language != "python" {
            return Err(Error::Invalid(format!("language `{language}` is not offered: contexts run Python")));
        }
        let cwd = crate::files::sandbox_path(cwd)?.to_string();
        if entry.contexts.list().len() >= MAX_CONTEXTS {
            return Err(Error::Capacity(format!("a sandbox may have at most {MAX_CONTEXTS} contexts besides its own")));
        }
        let context = Arc::new(Context {
            id: crate::ids::new_id().replacen("sb-", "ctx-", 1),
            language: language.into(),
            cwd: cwd.clone(),
            execs: Default::default(),
            slot: tokio::sync::Mutex::new(ReplSlot::empty(false)),
        });
        start_in(&entry, &context, &cwd).await?;
        entry.contexts.lock().push(Arc::clone(&context));
        Ok(context)
    }

    pub async fn contexts(&self, caller: &Caller, id: &str) -> Result<Vec<Arc<Context>>, Error> {
        Ok(self.get(caller, id).await?.contexts.list())
    }

    /// A fresh REPL for the context (its variables go; its cwd stays).
    pub async fn restart_context(&self, caller: &Caller, id: &str, context: &str) -> Result<(), Error> {
        let entry = self.get(caller, id).await?;
        let context = entry.contexts.get(context)?;
        context.slot.lock().await.session = None;
        start_in(&entry, &context, &context.cwd).await
    }

    pub async fn delete_context(&self, caller: &Caller, id: &str, context: &str) -> Result<(), Error> {
        let entry = self.get(caller, id).await?;
        let context = entry.contexts.get(context)?;
        entry.contexts.lock().retain(|c| c.id != context.id);
        // Its REPL ends with its session.
        context.slot.lock().await.session = None;
        Ok(())
    }
}

/// Start the context's REPL (on its first run) and move it to `cwd`.
async fn start_in(entry: &Arc<SandboxEntry>, context: &Context, cwd: &str) -> Result<(), Error> {
    crate::sandbox::freezer::ensure_running(entry).await?;
    let mut slot = context.slot.lock().await;
    entry.run_hidden(&mut slot, &chdir_code(cwd), START_TIMEOUT).await.map_err(|e| Error::Conflict(format!("the context's REPL did not start: {e}")))?;
    Ok(())
}

/// What an exec runs on: the sandbox's own REPL or one of its contexts.
#[derive(Clone, Default)]
pub enum Target {
    #[default]
    Sandbox,
    Context(Arc<Context>),
}

impl Target {
    pub(crate) async fn slot<'a>(&'a self, entry: &'a SandboxEntry) -> tokio::sync::MutexGuard<'a, ReplSlot> {
        match self {
            Target::Sandbox => entry.slot.lock().await,
            Target::Context(c) => c.slot.lock().await,
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn chdir_quotes_the_path() {
        assert_eq!(super::chdir_code("/a'b"), "import os as _fb_os\n_fb_os.makedirs(\"/a'b\", exist_ok=True)\n_fb_os.chdir(\"/a'b\")\ndel _fb_os\n");
    }
}
