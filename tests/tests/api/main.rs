//! Integration tests of the service: the real binary's `Application` on a
//! random port, a real Postgres, a tiny random-weight model.

mod admin_and_ops;
mod auth;
mod bench;
mod binding;
mod chat;
mod disagg;
mod errors;
mod helpers;
mod ledger;
mod logprobs;
mod prefixes;
mod reports;
mod responses;
mod security;
mod sessions;
mod tools;
