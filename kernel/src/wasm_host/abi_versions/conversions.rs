//! keel-protocol's types and the kernel's bindings of the records keel's WIT defines for them,
//! converted by the macros the guests' bindings expand too (`keel_protocol::wit_conversions!`,
//! `wit_session_log_conversions!`),
//! so both sides of a typed door convert alike.

use super::since_v0_5::keel::plugin0_5_0::conversation;
use super::since_v0_6::keel::plugin0_6_0::{tool_registry, turns, verifier_types};
use super::since_v0_7::keel::plugin0_7_0::model_types;
use super::since_v0_8::keel::plugin0_8_0::session_log_types;

keel_protocol::wit_conversions!();
keel_protocol::wit_session_log_conversions!();
