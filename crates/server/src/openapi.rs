//! `GET /v1/openapi.json`: the API description, generated from the handlers.

use axum::response::IntoResponse;
use utoipa::OpenApi;

use crate::routes::{self, checkpoints, egress, files, pause, ports, pty, spaces, templates, watch};

#[derive(OpenApi)]
#[openapi(
    info(title = "forkbox", description = "Self-hosted sandboxes for AI agents; speaks the podflare SDK's HTTP contract."),
    paths(
        routes::healthz, routes::create, routes::list, routes::info, routes::destroy, routes::exec,
        routes::replay, routes::fork, routes::merge_into, routes::pool, routes::diff,
        files::get, files::put, files::delete, files::mkdir, files::rename, files::chmod, watch::watch,
        egress::get, egress::patch, pause::pause, pause::resume,
        pty::create, pty::list, pty::attach, pty::input, pty::resize, pty::kill, pty::read,
        ports::proxy, checkpoints::create, checkpoints::list, checkpoints::delete, checkpoints::restore,
        spaces::freeze, spaces::hibernate, spaces::list, spaces::get, spaces::delete, spaces::resume,
        templates::list, templates::get, templates::delete, templates::build, templates::save
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
        protocol::TemplateRecipe, protocol::TemplateFile, protocol::TemplateLimits, protocol::BuildEvent, protocol::SaveTemplate, protocol::TemplateUse,
        service::pool::PoolInfo, service::pool::PoolTemplate)),
    modifiers(&BearerAuth, &IdErrors),
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

/// What every route taking a sandbox or space id may answer besides its own
/// codes (`AppState::get`, `spaces::Spaces::get`): 400 for an id that cannot
/// be one, and for a sandbox 409 while it is frozen in a space. Added here
/// once rather than in each `#[utoipa::path]`; found by schemathesis
/// (docs/reliability.md#fuzzing).
struct IdErrors;

impl utoipa::Modify for IdErrors {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::RefOr;
        // Every route documents 404 or 400 with an `ErrorBody`: the shape
        // the added codes share.
        let error_body = openapi.paths.paths.values().find_map(|item| {
            let op = item.get.as_ref().or(item.post.as_ref())?;
            match op.responses.responses.get("404") {
                Some(RefOr::T(r)) => Some(r.clone()),
                _ => None,
            }
        });
        let Some(error_body) = error_body else { return };
        for (path, item) in openapi.paths.paths.iter_mut() {
            // Any request while the server drains for shutdown (src/drain.rs).
            let mut extra = vec![("503", "the server is shutting down")];
            if path.starts_with("/v1/sandboxes/{id}") {
                extra.push(("400", "invalid sandbox id"));
                extra.push(("409", "the sandbox is frozen in a space"));
            } else if path.starts_with("/v1/spaces/{id}") {
                extra.push(("400", "invalid space id"));
            }
            let ops = [&mut item.get, &mut item.put, &mut item.post, &mut item.delete, &mut item.options, &mut item.head, &mut item.patch, &mut item.trace];
            for op in ops.into_iter().flatten() {
                for (code, why) in &extra {
                    let mut r = error_body.clone();
                    r.description = (*why).to_string();
                    op.responses.responses.entry((*code).to_string()).or_insert(RefOr::T(r));
                }
            }
        }
    }
}

pub async fn openapi_json() -> impl IntoResponse {
    axum::Json(ApiDoc::openapi())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_routes_document_bad_ids_and_frozen_sandboxes() {
        let doc = serde_json::to_value(ApiDoc::openapi()).expect("serializable");
        let mut seen = 0;
        for (path, item) in doc["paths"].as_object().expect("paths") {
            let codes: &[&str] = if path.starts_with("/v1/sandboxes/{id}") {
                &["400", "404", "409"]
            } else if path.starts_with("/v1/spaces/{id}") {
                &["400", "404"]
            } else {
                continue;
            };
            for (method, op) in item.as_object().expect("path item") {
                for code in codes {
                    assert!(op["responses"].get(*code).is_some(), "{method} {path} does not document {code}");
                }
                seen += 1;
            }
        }
        assert!(seen > 30, "{seen} operations");
    }
}
