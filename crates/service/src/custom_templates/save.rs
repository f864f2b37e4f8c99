//! `POST /v1/sandboxes/{id}/template`: a live sandbox's files and REPL
//! state become a template (docs/templates.md#saving-a-sandbox).
//!
//! The REPL writes its state as for a Space (`spaces::space_code`), the
//! sandbox is paused while its writable layer is copied into a new layer
//! over the one it runs on, and then it goes on as before. The REPL state
//! is kept beside the layer, not in it: a template's zygote loads it once
//! and every new sandbox forks from that zygote (src/pool.rs).

use std::sync::Arc;

use protocol::{SaveTemplate, TemplateInfo, TemplateLimits};

use crate::error::Error;
use crate::keys::Caller;
use crate::sandbox::SandboxEntry;
use crate::spaces::unsaved_list;
use crate::state::Service;
use crate::templates::layers::{self, LayerMeta};
use crate::templates::user::UserTemplate;

/// Where the REPL writes its state, inside the sandbox (as for a Space).
const STATE_DIR: &str = ".forkbox-space";

impl Service {
    pub async fn save_template(&self, caller: &Caller, id: &str, req: SaveTemplate) -> Result<TemplateInfo, Error> {
        self.check_new_name(caller, &req.name)?;
        let entry = self.get(caller, id).await?;
        crate::disk::ensure_room(&self.inner.config.state_dir)?;
        let busy = entry.hold_busy();
        let saved = self.save_entry(&entry).await;
        drop(busy);
        let (layer, unsaved, _pinned) = saved?;
        let templates = &self.inner.templates;
        let base = entry.settings.template.clone();
        let t = UserTemplate {
            name: req.name.clone(),
            owner: caller.owner().or_else(|| entry.settings.owner.clone()),
            kind: "saved".into(),
            description: req.description,
            base: base.clone(),
            top: Some(layer.key.clone()),
            base_rootfs: layer.base_rootfs.clone(),
            base_top: layer.parent.clone(),
            preimport: templates.preimport(&base),
            // Its sandboxes need the memory the saved state took.
            limits: TemplateLimits { ram_mib: Some(entry.settings.ram_mib), rootfs_gb: Some(entry.settings.rootfs_gb), ..templates.limits(&base) },
            recipe: None,
            saved_from: Some(entry.id.clone()),
            unsaved,
            created_at: repl_host::events::now_ms(),
        };
        let info = self.register_template(t).await?;
        tracing::info!(sandbox = %id, template = %req.name, bytes = layer.bytes, "saved a sandbox as a template");
        Ok(info)
    }

    /// Copy the sandbox's files and REPL state into a new layer; the
    /// sandbox goes on as it was (paused again if it was paused).
    async fn save_entry(&self, entry: &Arc<SandboxEntry>) -> Result<(LayerMeta, Vec<protocol::Unsaved>, layers::Pins), Error> {
        let mut slot = entry.slot.lock().await;
        if !entry.lifecycle().can_run() {
            return Err(Error::NotFound(format!("sandbox `{}` was destroyed", entry.id)));
        }
        let was_paused = entry.engine.is_paused();
        let answer = self.write_repl_state(entry, &mut slot, was_paused).await?;
        if let Err(e) = crate::sandbox::freezer::set_paused(entry, true).await {
            self.undo_freeze(entry, was_paused).await;
            return Err(e);
        }
        let layers = self.inner.templates.layers.clone();
        let rootfs = entry.engine.layers().1;
        let parent = layers.key_of_rootfs(&rootfs);
        let base_rootfs = match &parent {
            Some(k) => layers.chain(k).ok().and_then(|c| c.last().map(|m| m.base_rootfs.clone())).unwrap_or(rootfs.clone()),
            None => rootfs.clone(),
        };
        let key = layers::unique_key();
        let mut pins = layers.pins();
        pins.add(&key);
        let engine = Arc::clone(&entry.engine);
        let step = format!("saved from {}", entry.id);
        let written = tokio::task::spawn_blocking(move || {
            layers.commit(&key, parent.as_deref(), &base_rootfs, &step, |dir| {
                let copied = engine.export_upper(&dir.join("diff")).map_err(std::io::Error::from)?;
                // The REPL state goes beside the files: sandboxes of the
                // template get it loaded, not as a file.
                let state = dir.join("diff").join(STATE_DIR);
                if state.exists() {
                    std::fs::create_dir(dir.join("repl"))?;
                    std::fs::rename(&state, dir.join("repl").join(STATE_DIR))?;
                }
                Ok(copied.bytes)
            })
        })
        .await
        .map_err(|e| Error::Internal(format!("save task failed: {e}")))?;
        self.undo_freeze(entry, was_paused).await;
        drop(slot);
        let layer = written.map_err(|e| match e.raw_os_error() {
            Some(libc::ENOSPC) => Error::NoSpace("no room on the server's disk for the template".into()),
            _ => Error::Internal(format!("could not write the template: {e}")),
        })?;
        // The new layer stays pinned until the caller registered it.
        Ok((layer, unsaved_list(&answer["unsaved"]), pins))
    }
}
