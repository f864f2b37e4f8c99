//! Code contexts: more persistent Python REPLs in one sandbox, each with
//! its own variables and working directory, all sharing the sandbox's files
//! and processes (E2B's code-interpreter contexts, docs/e2b.md#contexts).
//! The sandbox's own REPL is its default context; each other context's REPL
//! starts on its create and runs its execs in order, beside the others.

use std::sync::Arc;
use std::time::Duration;

use crate::error::Error;
use crate::keys::Caller;
pub use crate::sandbox::contexts::{Context, Contexts, Target};
use crate::sandbox::{ReplSlot, SandboxEntry};
use crate::state::Service;

/// Contexts per sandbox besides its own REPL (429 beyond).
pub const MAX_CONTEXTS: usize = 16;
/// How long a new context's REPL may take to start.
const START_TIMEOUT: Duration = Duration::from_secs(60);

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

#[cfg(test)]
mod tests {
    #[test]
    fn chdir_quotes_the_path() {
        assert_eq!(super::chdir_code("/a'b"), "import os as _fb_os\n_fb_os.makedirs(\"/a'b\", exist_ok=True)\n_fb_os.chdir(\"/a'b\")\ndel _fb_os\n");
    }
}
