//! Outbound request bodies, copied out of a plugin's memory into a buffer the kernel reuses.
//!
//! A model request's body is the whole conversation, so in a long turn each one is a few
//! kilobytes larger than the last. Copied into a fresh allocation each time, it defeated the
//! allocator's reuse: glibc serves an allocation larger than any it freed before with a new
//! `mmap`, so every step faulted in every page of a body of megabytes and unmapped it again
//! after the send (at 5 MB of history that was about 3 ms of a 7 ms step). Here the body is
//! copied into the spare buffer when it is large enough, and the buffer comes back when the
//! last reference to the sent bytes is dropped (after the send and any redirect). A buffer too
//! small is replaced by one with room to grow, so a growing conversation reallocates once per
//! doubling rather than once per step.
//!
//! What is kept is one buffer of at most [`KEPT_AT_MOST`] bytes of capacity (a larger body is
//! copied plainly, as before); the buffer holds exactly the bytes of the body it carries
//! (cleared and refilled), never another request's.

use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;

/// The largest buffer kept for the next request. A larger body is still sent; its buffer is
/// freed afterwards.
pub(crate) const KEPT_AT_MOST: usize = 16 * 1024 * 1024;

/// The spare buffer, shared by every plugin's requests (it carries only bytes, one request's
/// at a time).
#[derive(Default)]
pub(crate) struct RequestBuffers {
    spare: Arc<Mutex<Option<Vec<u8>>>>,
}

impl RequestBuffers {
    /// `body` as bytes the HTTP client can send, in the spare buffer when it fits.
    pub(crate) fn copy(&self, body: &[u8]) -> Bytes {
        if body.len() > KEPT_AT_MOST {
            // Copied plainly and never kept (the client refuses a body over its own limit).
            return Bytes::copy_from_slice(body);
        }
        let spare = self
            .spare
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let mut buffer = match spare {
            Some(buffer) if buffer.capacity() >= body.len() => buffer,
            // Room for the conversation to grow for a while: pages not yet written cost no
            // memory.
            _ => Vec::with_capacity((body.len() * 2).clamp(64 * 1024, KEPT_AT_MOST)),
        };
        buffer.clear();
        buffer.extend_from_slice(body);
        Bytes::from_owner(Lent {
            buffer,
            home: Arc::clone(&self.spare),
        })
    }

    /// The capacity of the spare buffer, if one is kept.
    #[cfg(test)]
    fn spare_capacity(&self) -> Option<usize> {
        self.spare
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(Vec::capacity)
    }
}

/// A buffer lent to one request's bytes; it goes back when they are dropped.
struct Lent {
    buffer: Vec<u8>,
    home: Arc<Mutex<Option<Vec<u8>>>>,
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        &self.buffer
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if self.buffer.capacity() > KEPT_AT_MOST {
            return;
        }
        let mut spare = self.home.lock().unwrap_or_else(PoisonError::into_inner);
        // Two requests in flight at once: keep the larger buffer.
        if spare
            .as_ref()
            .is_none_or(|kept| kept.capacity() < self.buffer.capacity())
        {
            *spare = Some(std::mem::take(&mut self.buffer));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_is_copied_whole_and_its_buffer_reused_once_the_bytes_are_dropped() {
        let buffers = RequestBuffers::default();
        let first = buffers.copy(&[7u8; 100_000]);
        assert_eq!(first.len(), 100_000);
        assert!(first.iter().all(|&b| b == 7));
        // Still in use: nothing to reuse.
        assert_eq!(buffers.spare_capacity(), None);
        let clone = first.clone();
        drop(first);
        assert_eq!(
            buffers.spare_capacity(),
            None,
            "a clone still holds the bytes"
        );
        drop(clone);
        let kept = buffers.spare_capacity().expect("the buffer came back");
        assert!(kept >= 200_000, "room to grow: {kept}");

        // A shorter body in the same buffer carries only its own bytes.
        let second = buffers.copy(b"short");
        assert_eq!(&second[..], b"short");
        assert_eq!(buffers.spare_capacity(), None, "the spare is lent out");
        drop(second);
        assert_eq!(
            buffers.spare_capacity(),
            Some(kept),
            "the same buffer again"
        );
    }

    #[test]
    fn a_body_larger_than_the_spare_gets_a_new_buffer_and_a_huge_one_is_never_kept() {
        let buffers = RequestBuffers::default();
        drop(buffers.copy(&[1u8; 10]));
        let small = buffers.spare_capacity().expect("kept");
        let larger = vec![2u8; small + 1];
        let sent = buffers.copy(&larger);
        assert_eq!(&sent[..], &larger[..]);
        drop(sent);
        assert!(buffers.spare_capacity().expect("kept") > small);

        // Up to the limit a buffer is kept, its room clamped to it.
        let large = vec![3u8; KEPT_AT_MOST / 2 + 1];
        drop(buffers.copy(&large));
        assert_eq!(buffers.spare_capacity(), Some(KEPT_AT_MOST));

        // Beyond it the body is copied plainly: the spare stays as it was.
        let huge = vec![4u8; KEPT_AT_MOST + 1];
        let sent = buffers.copy(&huge);
        assert_eq!(&sent[..], &huge[..]);
        drop(sent);
        assert_eq!(buffers.spare_capacity(), Some(KEPT_AT_MOST));
    }
}
