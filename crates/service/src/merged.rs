//! Ids merged away (docs/fork.md#merge), remembered so a late call to one
//! gets a clear answer: a late DELETE is harmless, a late exec a 404 that
//! names the id holding its state now.

use std::collections::{HashMap, VecDeque};

/// How many merged-away ids are remembered.
const MERGED_REMEMBERED: usize = 10_000;

/// Merged-away id → the id holding its state now and its owner, oldest
/// first out.
#[derive(Default)]
pub struct MergedIds {
    map: HashMap<String, (String, Option<String>)>,
    order: VecDeque<String>,
}

impl MergedIds {
    pub fn insert(&mut self, gone: String, into: String, owner: Option<String>) {
        if self.order.len() >= MERGED_REMEMBERED {
            if let Some(old) = self.order.pop_front() {
                self.map.remove(&old);
            }
        }
        self.order.push_back(gone.clone());
        self.map.insert(gone, (into, owner));
    }

    pub fn get(&self, id: &str) -> Option<&(String, Option<String>)> {
        self.map.get(id)
    }
}
