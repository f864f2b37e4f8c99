//! `GET /v1/openapi.json`: the API description, generated from the handlers.

use axum::response::IntoResponse;
use utoipa::OpenApi;

use crate::{checkpoints, egress, spaces, files, pause, ports, pty, routes, watch};

#[derive(OpenApi)]
#[openapi(
    info(title = "forkbox", description = "Self-hosted sandboxes for AI agents; speaks the podflare SDK's HTTP contract."),
    paths(
        routes::healthz, routes::create, routes::list, routes::info, routes::destroy, routes::exec,
        routes::replay, routes::templates, routes::fork, routes::merge_into, routes::pool, routes::diff,
        files::get, files::put, files::delete, files::mkdir, files::rename, files::chmod, watch::watch,
        egress::get, egress::patch, pause::pause, pause::resume,
        pty::create, pty::list, pty::attach, pty::input, pty::resize, pty::kill, pty::read,
        ports::proxy, checkpoints::create, checkpoints::list, checkpoints::delete, checkpoints::restore,
        spaces::freeze, spaces::list, spaces::get, spaces::delete, spaces::resume
    ),
    components(schemas(protocol::CreateSandbox, protocol::Created, protocol::ExecRequest, protocol::SandboxInfo,
        protocol::SandboxList, protocol::ErrorBody, protocol::Event, protocol::EventKind, protocol::TemplateInfo,
        protocol::ForkRequest, protocol::Forked, protocol::DiffResult,
        protocol::FileInfo, protocol::FileType, protocol::FileList, protocol::Written, protocol::FileMode,
        protocol::MkdirRequest, protocol::RenameRequest, protocol::ChmodRequest, protocol::FileEvent,
        protocol::Egress, protocol::EgressAllow, protocol::EgressBody,
        pty::PtyCreate, pty::PtyInput, pty::PtyResize, pty::PtyRead, pty::PtyChunk, pty::PtyInfo,
        protocol::CheckpointInfo, protocol::CheckpointList, protocol::RestoreRequest,
        protocol::SpaceInfo, protocol::SpaceList, protocol::ResumeSpace, protocol::Unsaved,
        crate::pool::PoolInfo, crate::pool::PoolTemplate)),
    modifiers(&BearerAuth),
    security(("bearer" = []))
)]
pub struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme("bearer", SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()));
    }
}

pub async fn openapi_json() -> impl IntoResponse {
    axum::Json(ApiDoc::openapi())
}
