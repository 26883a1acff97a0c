//! Route registration and the OpenAPI document (generated from the
//! handlers' annotations).

pub mod admin;
pub mod ops;
pub mod prefixes;
pub mod reports;
pub mod repos;
pub mod sign_in;
pub mod tasks;
pub mod usage;
pub mod webhooks;

use crate::{openai, sessions};
use actix_web::web;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

#[derive(Debug, OpenApi)]
#[openapi(
    info(title = "cachet", description = "An LLM backend for coding agents: OpenAI-compatible, multi-tenant, prefix-cached."),
    paths(
        openai::list_models, openai::chat::chat_completions, openai::completions::completions, openai::responses::create_response, usage::usage,
        openai::tokenize::tokenize, openai::tokenize::detokenize,
        admin::create_tenant, admin::list_tenants, admin::delete_tenant, admin::issue_token,
        prefixes::add, prefixes::list, prefixes::remove, prefixes::candidates,
        ops::healthz, ops::readyz, ops::metrics,
        repos::create_repo, repos::list_repos, repos::get_repo, repos::delete_repo, repos::rotate_webhook_secret,
        webhooks::git_webhook,
        sessions::create_session, sessions::get_session, sessions::delete_session, sessions::message::post_message,
        tasks::create_task, tasks::list_tasks, tasks::get_task, tasks::task_outcome,
        reports::tenant_report, reports::operator_report, reports::report_page, sign_in::create_link,
    ),
    components(schemas(
        openai::types::ChatCompletionRequest, openai::types::CompletionRequest, openai::types::ChatCompletion,
        openai::types::TextCompletion, openai::types::ModelList, openai::types::Usage, openai::responses::ResponseRequest,
        admin::NewTenant, admin::NewToken, prefixes::NewPublicPrefix, crate::prefixes::Source,
        repos::NewRepo, sessions::NewSession, sessions::message::MessageRequest, tasks::NewTask, tasks::Outcome,
    )),
    modifiers(&Bearer),
)]
pub struct ApiDoc;

struct Bearer;

impl Modify for Bearer {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).bearer_format("JWT").build()),
        );
    }
}

/// Registers every route.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(openai::list_models)
        .service(crate::handoff::get_chunk)
        .service(crate::disagg::prefill)
        .service(openai::chat::chat_completions)
        .service(openai::completions::completions)
        .service(openai::responses::create_response)
        .service(openai::tokenize::tokenize)
        .service(openai::tokenize::detokenize)
        .service(usage::usage)
        .service(repos::create_repo)
        .service(repos::list_repos)
        .service(repos::get_repo)
        .service(repos::delete_repo)
        .service(repos::rotate_webhook_secret)
        .service(webhooks::git_webhook)
        .service(sessions::create_session)
        .service(sessions::get_session)
        .service(sessions::delete_session)
        .service(sessions::post_message)
        .service(tasks::create_task)
        .service(tasks::list_tasks)
        .service(tasks::get_task)
        .service(tasks::task_outcome)
        .service(reports::tenant_report)
        .service(reports::operator_report)
        .service(reports::report_page)
        .service(sign_in::create_link)
        .service(sign_in::sign_in_with_code)
        .service(sign_in::sign_in_with_form)
        .service(sign_in::sign_out)
        .service(admin::create_tenant)
        .service(admin::list_tenants)
        .service(admin::delete_tenant)
        .service(admin::issue_token)
        // Before `remove`: `candidates` is not an id.
        .service(prefixes::candidates)
        .service(prefixes::add)
        .service(prefixes::list)
        .service(prefixes::remove)
        .service(ops::healthz)
        .service(ops::readyz)
        .service(ops::metrics)
        .service(ops::openapi);
}
