//! Stored responses (`store: true`, the default): each response object with the conversation
//! it ended (the chat messages a `previous_response_id` continues), kept in memory under a
//! count and a byte bound, the oldest dropped first. A stored response lives on the replica
//! that made it.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use serde_json::Value;

use crate::server::request::ChatMessageIn;

/// Responses kept by default.
pub const DEFAULT_MAX_RESPONSES: usize = 1000;
/// Bytes of stored responses and conversations kept by default.
pub const DEFAULT_MAX_BYTES: usize = 64 << 20;

/// One stored response.
#[derive(Debug, Clone)]
pub struct Stored {
    /// The response object, as `GET` returns it.
    pub response: Value,
    /// The conversation it ended, without the instructions: its input (after what the
    /// response it continued held) and its output, as chat messages.
    pub conversation: Vec<ChatMessageIn>,
    /// The response failed: it can be fetched but not continued.
    pub failed: bool,
    bytes: usize,
}

impl Stored {
    /// A response and its conversation.
    pub fn new(response: Value, conversation: Vec<ChatMessageIn>) -> Self {
        Self::with(response, conversation, false)
    }

    /// A response that failed, and its input.
    pub fn failed(response: Value, input: Vec<ChatMessageIn>) -> Self {
        Self::with(response, input, true)
    }

    fn with(response: Value, conversation: Vec<ChatMessageIn>, failed: bool) -> Self {
        let bytes = response.to_string().len()
            + conversation
                .iter()
                .map(|m| serde_json::to_string(m).map_or(0, |s| s.len()))
                .sum::<usize>();
        Self {
            response,
            conversation,
            failed,
            bytes,
        }
    }
}

#[derive(Debug, Default)]
struct Entries {
    by_id: HashMap<String, Stored>,
    /// Ids, oldest first.
    order: VecDeque<String>,
    bytes: usize,
}

/// The store.
#[derive(Debug)]
pub struct ResponseStore {
    entries: Mutex<Entries>,
    max_responses: usize,
    max_bytes: usize,
}

impl Default for ResponseStore {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_RESPONSES, DEFAULT_MAX_BYTES)
    }
}

impl ResponseStore {
    /// At most `max_responses` responses and `max_bytes` bytes (0 responses: nothing kept).
    pub fn new(max_responses: usize, max_bytes: usize) -> Self {
        Self {
            entries: Mutex::new(Entries::default()),
            max_responses,
            max_bytes,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `stored` under `id`, dropping the oldest past the bounds (a response larger
    /// than the whole byte bound is not kept).
    pub fn put(&self, id: String, stored: Stored) {
        if self.max_responses == 0 || stored.bytes > self.max_bytes {
            return;
        }
        let mut entries = self.lock();
        entries.bytes += stored.bytes;
        if let Some(old) = entries.by_id.insert(id.clone(), stored) {
            entries.bytes -= old.bytes;
            entries.order.retain(|o| o != &id);
        }
        entries.order.push_back(id);
        while entries.order.len() > self.max_responses || entries.bytes > self.max_bytes {
            let Some(oldest) = entries.order.pop_front() else {
                break;
            };
            if let Some(old) = entries.by_id.remove(&oldest) {
                entries.bytes -= old.bytes;
            }
        }
    }

    /// The response stored under `id`.
    pub fn get(&self, id: &str) -> Option<Stored> {
        self.lock().by_id.get(id).cloned()
    }

    /// Forgets `id`; whether it was there.
    pub fn delete(&self, id: &str) -> bool {
        let mut entries = self.lock();
        match entries.by_id.remove(id) {
            Some(old) => {
                entries.bytes -= old.bytes;
                entries.order.retain(|o| o != id);
                true
            }
            None => false,
        }
    }

    /// Responses stored.
    pub fn len(&self) -> usize {
        self.lock().by_id.len()
    }

    /// Whether none is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stored(text: &str) -> Stored {
        Stored::new(
            json!({"text": text}),
            vec![ChatMessageIn::text("user", text)],
        )
    }

    #[test]
    fn the_oldest_go_first_past_either_bound() {
        let store = ResponseStore::new(2, 1 << 20);
        store.put("a".into(), stored("one"));
        store.put("b".into(), stored("two"));
        store.put("c".into(), stored("three"));
        assert!(store.get("a").is_none());
        assert!(store.get("b").is_some() && store.get("c").is_some());
        assert!(store.delete("b"));
        assert!(!store.delete("b"));
        assert_eq!(store.len(), 1);
        // A byte bound that holds about two of these.
        let size = stored(&"x".repeat(100)).bytes;
        let store = ResponseStore::new(100, 2 * size + size / 2);
        for id in ["a", "b", "c"] {
            store.put(id.into(), stored(&"x".repeat(100)));
        }
        assert!(store.get("a").is_none());
        assert_eq!(store.len(), 2);
        // Larger than the whole bound: not kept, nothing else dropped.
        store.put("big".into(), stored(&"x".repeat(10 * size)));
        assert!(store.get("big").is_none());
        assert_eq!(store.len(), 2);
        // Nothing kept at all.
        let none = ResponseStore::new(0, 1 << 20);
        none.put("a".into(), stored("one"));
        assert!(none.is_empty());
    }
}
