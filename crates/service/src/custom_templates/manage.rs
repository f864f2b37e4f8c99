//! What depends on a custom template, registering one, deleting one, and
//! collecting the layers nothing uses any more.

use std::collections::HashSet;

use protocol::{TemplateInfo, TemplateUse};

use crate::directory::TemplateBeyond;
use crate::error::Error;
use crate::keys::Caller;
use crate::state::Service;
use crate::templates::user::UserTemplate;

impl Service {
    /// Live sandboxes and Spaces made from `name`, and templates built on it.
    pub async fn template_use(&self, name: &str) -> TemplateUse {
        let mut sandboxes: Vec<String> = self.inner.sandboxes.read().await.values().filter(|e| e.settings.template == name).map(|e| e.id.clone()).collect();
        sandboxes.sort();
        let spaces = self.inner.spaces.list_all().into_iter().filter(|s| s.info.template == name).map(|s| s.info.space_id).collect();
        let mut templates: Vec<String> = self.inner.templates.customs().into_iter().filter(|t| t.base == name).map(|t| t.name).collect();
        templates.sort();
        TemplateUse { sandboxes, spaces, templates }
    }

    pub async fn template_info(&self, caller: &Caller, name: &str) -> Result<TemplateInfo, Error> {
        self.ensure_template(name).await?;
        let mut info = self.inner.templates.info(caller, name)?;
        info.in_use = self.template_use(name).await;
        Ok(info)
    }

    pub async fn template_list(&self, caller: &Caller) -> Result<Vec<TemplateInfo>, Error> {
        let mut all = self.inner.templates.list(caller);
        for info in &mut all {
            info.in_use = self.template_use(&info.name).await;
        }
        // A cluster's templates this node has not fetched yet.
        if let Some(beyond) = self.inner.directory.templates().await? {
            for t in beyond.iter().filter(|t| caller.may_use(t.owner.as_deref())) {
                if !all.iter().any(|i| i.name == t.name) {
                    all.push(self.inner.templates.custom_info(t));
                }
            }
            // One deleted elsewhere is gone everywhere.
            all.retain(|i| self.inner.templates.is_builtin(&i.name) || beyond.iter().any(|t| t.name == i.name));
        }
        all.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(all)
    }

    /// Have custom template `name` here as it is beyond this server (a
    /// cluster's, made on another node): fetched if this server lacks it or
    /// holds an older version, dropped if it was deleted there. Nothing to
    /// do on a single server.
    pub(crate) async fn ensure_template(&self, name: &str) -> Result<(), Error> {
        if self.inner.templates.is_builtin(name) {
            return Ok(());
        }
        let local = self.inner.templates.custom(name);
        match self.inner.directory.template(name).await? {
            TemplateBeyond::NotKept => Ok(()),
            TemplateBeyond::Unknown => {
                if local.is_some() {
                    self.forget_template_here(name).await?;
                }
                Ok(())
            }
            TemplateBeyond::Known(t, layers) => {
                if local.is_some_and(|l| l.top == t.top && l.preimport == t.preimport && l.limits == t.limits && l.owner == t.owner) {
                    return Ok(());
                }
                for key in &layers {
                    if !self.inner.templates.layers.exists(key) {
                        self.inner.directory.fetch_layer(key, &self.inner.templates.layers.dir(key)).await?;
                    }
                }
                tracing::info!(template = %name, layers = layers.len(), "fetched a template made on another node");
                self.register_template_here(*t).await.map(|_| ())
            }
        }
    }

    /// A custom template name `caller` may take: not a built-in's, and not
    /// another key's template.
    pub(crate) fn check_new_name(&self, caller: &Caller, name: &str) -> Result<(), Error> {
        if !template::is_valid_name(name) {
            return Err(Error::Invalid(format!(
                "template name {:?} must be 1 to 64 lower-case letters, digits, '-' or '_', starting with a letter or digit",
                name.chars().take(80).collect::<String>()
            )));
        }
        if self.inner.templates.is_builtin(name) {
            return Err(Error::Conflict(format!("`{name}` is a built-in template; choose another name")));
        }
        match self.inner.templates.custom(name) {
            Some(t) if !caller.may_use(t.owner.as_deref()) => Err(Error::Conflict(format!("the template name `{name}` is taken"))),
            _ => Ok(()),
        }
    }

    /// Register `t` (replacing a template of that name), then warm its pool
    /// so the first create is a fork, and drop layers the old one alone used.
    pub(crate) async fn register_template(&self, t: UserTemplate) -> Result<TemplateInfo, Error> {
        let chain = match &t.top {
            Some(top) => self.inner.templates.layers.chain(top).map_err(|e| Error::Internal(format!("read the template's layers: {e}")))?,
            None => Vec::new(),
        };
        let layers: Vec<(String, std::path::PathBuf)> = chain.iter().rev().map(|m| (m.key.clone(), self.inner.templates.layers.dir(&m.key))).collect();
        // Servable from every node of a cluster first (a single server has
        // nothing beyond it): a template this node had alone would be
        // taken for one deleted elsewhere.
        self.inner.directory.publish_template(&t, &layers).await?;
        self.register_template_here(t).await
    }

    /// `register_template` on this server alone.
    async fn register_template_here(&self, t: UserTemplate) -> Result<TemplateInfo, Error> {
        let name = t.name.clone();
        let pool_key = crate::pool::PoolKey { owner: t.owner.clone(), template: name.clone() };
        self.inner.templates.layers_root(&t).map_err(|e| Error::Internal(format!("mount the template `{name}`: {e}")))?;
        let changed = self.inner.templates.custom(&name).is_none_or(|old| old.top != t.top || old.preimport != t.preimport || old.limits != t.limits);
        if changed {
            self.inner
                .templates
                .user
                .write()
                .map_err(|_| Error::Internal("template registry".into()))?
                .put(t)
                .map_err(|e| Error::Internal(format!("save the template `{name}`: {e}")))?;
            // From here on, creates get the new version.
            self.drop_zygotes(&name).await;
            self.inner.pool.want(pool_key);
            let me = self.clone();
            tokio::spawn(async move { me.collect_layers().await });
        }
        tracing::info!(template = %name, changed, "template registered");
        Ok(self.inner.templates.custom(&name).map(|t| self.inner.templates.custom_info(&t)).unwrap_or_default())
    }

    /// `DELETE /v1/templates/{name}`: `409` while sandboxes or Spaces use
    /// it, unless `force`; its live sandboxes keep their files either way.
    pub async fn delete_template(&self, caller: &Caller, name: &str, force: bool) -> Result<(), Error> {
        if self.inner.templates.is_builtin(name) {
            return Err(Error::Conflict(format!("`{name}` is a built-in template; it cannot be deleted")));
        }
        self.ensure_template(name).await?;
        self.inner.templates.check_visible(caller, name)?;
        let used = self.template_use(name).await;
        let unused = used.sandboxes.is_empty() && used.spaces.is_empty();
        if !(force || unused) {
            return Err(Error::Conflict(format!(
                "template `{name}` is in use by {} sandbox(es) and {} space(s); delete them first, or pass ?force=true",
                used.sandboxes.len(),
                used.spaces.len()
            )));
        }
        self.inner.directory.forget_template(name).await?;
        self.forget_template_here(name).await?;
        tracing::info!(template = %name, force, "template deleted");
        Ok(())
    }

    /// Drop custom template `name` on this server: its record, its
    /// zygotes, the layers nothing else stands on.
    async fn forget_template_here(&self, name: &str) -> Result<(), Error> {
        self.inner
            .templates
            .user
            .write()
            .map_err(|_| Error::Internal("template registry".into()))?
            .remove(name)
            .map_err(|e| Error::Internal(format!("delete the template `{name}`: {e}")))?;
        if let Ok(u) = self.inner.templates.user.read() {
            u.forget_build_cache(name);
        }
        self.drop_zygotes(name).await;
        self.collect_layers().await;
        Ok(())
    }

    /// At start: mount the stacks of the custom templates and of the
    /// sandboxes a previous server left (what `diff` reads as their
    /// template's files); drop layers nothing uses.
    pub async fn mount_template_stacks(&self) {
        let templates = self.inner.templates.clone();
        let mut tops: Vec<String> = templates.customs().into_iter().filter_map(|t| t.top).collect();
        tops.extend(self.inner.sandboxes.read().await.values().filter_map(|e| templates.layers.key_of_rootfs(&e.engine.layers().1)));
        let _ = tokio::task::spawn_blocking(move || {
            for key in tops {
                if let Err(e) = templates.layers.root(&key) {
                    tracing::warn!(layer = %key, err = %e, "could not mount a template's layers");
                }
            }
        })
        .await;
        self.collect_layers().await;
    }

    /// Remove the layers no template, live sandbox or zygote stands on.
    pub async fn collect_layers(&self) -> usize {
        let templates = &self.inner.templates;
        let mut keep: HashSet<String> = templates.layers_in_use();
        let mut roots: Vec<std::path::PathBuf> = self.inner.sandboxes.read().await.values().map(|e| e.engine.layers().1).collect();
        roots.extend(self.zygote_roots());
        for root in roots {
            if let Some(key) = templates.layers.key_of_rootfs(&root) {
                keep.extend(templates.layers.chain(&key).map(|c| c.into_iter().map(|m| m.key).collect::<Vec<_>>()).unwrap_or_else(|_| vec![key]));
            }
        }
        let layers = templates.layers.clone();
        let removed = tokio::task::spawn_blocking(move || layers.collect(&keep)).await.unwrap_or(0);
        if removed > 0 {
            tracing::info!(removed, "removed unused template layers");
        }
        removed
    }
}
