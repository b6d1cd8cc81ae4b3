//! The integration tests of the model wire formats and driver, as one test binary: each module was a binary of its own,
//! and linking one binary instead of several keeps builds and CI short.

mod decoders;
mod driver;
mod held;
mod render;
mod scripted;
mod sse_chunking;
