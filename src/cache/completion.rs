// TEMPORARY STUB until the helper's file lands
use crate::providers::Endpoint;
pub fn replay_sse(_endpoint: Endpoint, completion: &[u8], _include_usage: bool) -> Option<Vec<u8>> { Some(completion.to_vec()) }
pub struct StreamAssembler { body: Vec<u8> }
impl StreamAssembler {
    pub fn new(_endpoint: Endpoint, _max_bytes: usize) -> Self { StreamAssembler { body: Vec::new() } }
    pub fn push(&mut self, chunk: &[u8]) { self.body.extend_from_slice(chunk) }
    pub fn finish(self) -> Option<Vec<u8>> { None }
}
