//! Reading and changing a sandbox's egress policy (docs/network.md); what
//! runs for a policy is each sandbox's own (sandbox/network.rs).

use jail::egress::plan;
use protocol::Egress;

use crate::error::Error;
use crate::keys::Caller;
use crate::sandbox::network::apply;
use crate::state::Service;

impl Service {
    /// Sandbox `id`'s egress policy.
    pub async fn egress(&self, caller: &Caller, id: &str) -> Result<Egress, Error> {
        let entry = self.get(caller, id).await?;
        let egress = entry.egress.lock().unwrap_or_else(|e| e.into_inner()).clone();
        Ok(egress)
    }

    /// Put `egress` in force for sandbox `id` now, and keep it across
    /// restarts.
    pub async fn set_egress(&self, caller: &Caller, id: &str, egress: &Egress) -> Result<(), Error> {
        let entry = self.get(caller, id).await?;
        plan(egress)?;
        let mut net = entry.network.lock().await;
        apply(&entry, &mut net, egress).await?;
        self.inner.records.save(&entry);
        Ok(())
    }
}
