//! Interning of functions, frames and stacks, so that a steady-state sample is a few integer
//! lookups: no allocation, no string seen twice.
//!
//! - a *function* is a code object's identity by content (name, qualname, file, first line):
//!   a code object reloaded at another address keeps its [`FunctionId`];
//! - a *frame* is (function, line) -> [`FrameId`];
//! - a *stack* is a sequence of frame ids, innermost first -> [`StackId`].
//!
//! Function and frame ids are dense indices, valid until the table is [reset](StackTable::reset).
//! Stack ids are never reused across resets (they continue from where the last table ended),
//! so an id handed out before a reset resolves to nothing rather than to another stack. A
//! long-running profiler resets a table that grew too large, so its memory stays bounded.
//! This module knows nothing about targets: the unwinder hands it functions by content.

use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;

pub type FunctionId = u32;
pub type FrameId = u32;
pub type StackId = u32;

/// A frame by content: its function and line (`None` where the instruction has no line).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct FrameKey {
    pub function: FunctionId,
    pub line: Option<i32>,
}

/// A function by content (a code object reloaded at another address is the same function),
/// its names shared by every frame that shows it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Function {
    pub name: Arc<str>,
    pub qualname: Arc<str>,
    pub filename: Arc<str>,
    pub first_line: i32,
}

/// One frame of a resolved stack: its function and line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResolvedFrame<'a> {
    pub function: &'a Function,
    pub line: Option<i32>,
}

/// The interning tables of one unwinder.
#[derive(Debug, Default)]
pub struct StackTable {
    function_ids: HashMap<Function, FunctionId>,
    functions: Vec<Function>,
    frame_ids: HashMap<FrameKey, FrameId>,
    frames: Vec<FrameKey>,
    stack_ids: HashMap<Box<[FrameId]>, StackId>,
    stacks: Vec<Box<[FrameId]>>,
    /// Stack id of `stacks[0]`: stack ids handed out before the last reset are below it.
    stack_base: StackId,
}

impl StackTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// The id of a function (interning it the first time).
    pub fn function(&mut self, function: Function) -> FunctionId {
        if let Some(&id) = self.function_ids.get(&function) {
            return id;
        }
        let id = self.functions.len() as FunctionId;
        self.functions.push(function.clone());
        self.function_ids.insert(function, id);
        id
    }

    pub fn frame(&mut self, function: FunctionId, line: Option<i32>) -> FrameId {
        let key = FrameKey { function, line };
        if let Some(&id) = self.frame_ids.get(&key) {
            return id;
        }
        let id = self.frames.len() as FrameId;
        self.frames.push(key);
        self.frame_ids.insert(key, id);
        id
    }

    /// The id of a stack (innermost first). Allocates only for a stack never seen before.
    pub fn stack(&mut self, frames: &[FrameId]) -> StackId {
        if let Some(&id) = self.stack_ids.get(frames) {
            return id;
        }
        let id = self.stack_base.wrapping_add(self.stacks.len() as StackId);
        let boxed: Box<[FrameId]> = frames.into();
        self.stacks.push(boxed.clone());
        self.stack_ids.insert(boxed, id);
        id
    }

    /// The id of `stack` with `frame` added outermost (a view's root frame: see
    /// `crate::thread_frames`), `scratch` its buffer. `None` for an id from before a reset.
    pub fn with_outermost(
        &mut self,
        stack: StackId,
        frame: FrameId,
        scratch: &mut Vec<FrameId>,
    ) -> Option<StackId> {
        self.with_frame(stack, frame, scratch, false)
    }

    /// The id of `stack` with `frame` added innermost (a view's leaf frame: see
    /// `crate::gil_blame`), `scratch` its buffer. `None` for an id from before a reset.
    pub fn with_innermost(
        &mut self,
        stack: StackId,
        frame: FrameId,
        scratch: &mut Vec<FrameId>,
    ) -> Option<StackId> {
        self.with_frame(stack, frame, scratch, true)
    }

    fn with_frame(
        &mut self,
        stack: StackId,
        frame: FrameId,
        scratch: &mut Vec<FrameId>,
        innermost: bool,
    ) -> Option<StackId> {
        scratch.clear();
        scratch.extend_from_slice(self.stack_frames(stack)?);
        match innermost {
            true => scratch.insert(0, frame),
            false => scratch.push(frame),
        }
        Some(self.stack(scratch))
    }

    /// The frames of a stack, innermost first.
    pub fn stack_frames(&self, id: StackId) -> Option<&[FrameId]> {
        let index = id.wrapping_sub(self.stack_base) as usize;
        self.stacks.get(index).map(|s| &s[..])
    }

    /// Forgets everything; stack ids go on from where they were. Function and frame ids
    /// start again, so whoever holds them must forget them too.
    pub fn reset(&mut self) {
        self.stack_base = self.stack_base.wrapping_add(self.stacks.len() as StackId);
        self.function_ids.clear();
        self.functions.clear();
        self.frame_ids.clear();
        self.frames.clear();
        self.stack_ids.clear();
        self.stacks.clear();
    }

    /// The frames of a stack, innermost first, as functions and lines: the one way from a
    /// stack id to what it shows (`None` for an id from before a reset).
    pub fn resolve(&self, id: StackId) -> Option<impl Iterator<Item = ResolvedFrame<'_>> + '_> {
        let frames = self.stack_frames(id)?;
        Some(frames.iter().filter_map(|&f| self.resolve_frame(f)))
    }

    /// One frame as its function and line (`None` for an id from before a reset).
    pub fn resolve_frame(&self, id: FrameId) -> Option<ResolvedFrame<'_>> {
        let key = self.frames.get(id as usize)?;
        Some(ResolvedFrame {
            function: self.functions.get(key.function as usize)?,
            line: key.line,
        })
    }

    /// Sizes: (functions, frames, stacks).
    pub fn len(&self) -> (usize, usize, usize) {
        (self.functions.len(), self.frames.len(), self.stacks.len())
    }

    pub fn is_empty(&self) -> bool {
        self.stacks.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(name: &str, first_line: i32) -> Function {
        Function {
            name: name.into(),
            qualname: format!("C.{name}").into(),
            filename: "/f.py".into(),
            first_line,
        }
    }

    #[test]
    fn interning_is_stable_and_by_content() {
        let mut t = StackTable::new();
        let (a, a_again, b) = (code("a", 1), code("a", 1), code("b", 9));
        let fa = t.function(a.clone());
        assert_eq!(t.function(a_again), fa, "same content, same function");
        let fb = t.function(b);
        assert_ne!(fa, fb);
        let (x, y) = (t.frame(fa, Some(3)), t.frame(fb, None));
        assert_eq!(t.frame(fa, Some(3)), x);
        assert_ne!(t.frame(fa, Some(4)), x);
        let s = t.stack(&[x, y]);
        assert_eq!(t.stack(&[x, y]), s);
        assert_ne!(t.stack(&[y, x]), s);
        assert_eq!(t.stack_frames(s), Some(&[x, y][..]));
        let r: Vec<_> = t.resolve(s).unwrap().collect();
        assert_eq!(&*r[0].function.name, "a");
        assert_eq!(r[0].line, Some(3));
        assert_eq!(r[1].line, None);
        assert_eq!(t.len(), (2, 3, 2));
    }

    #[test]
    fn interning_and_reset() {
        let mut t = StackTable::new();
        let f = t.function(code("a", 1));
        assert_eq!(t.function(code("a", 1)), f);
        let (x, y) = (t.frame(f, Some(1)), t.frame(f, Some(2)));
        let s1 = t.stack(&[x, y]);
        assert_eq!(t.stack(&[x, y]), s1);
        let s2 = t.stack(&[y]);
        assert_ne!(s1, s2);
        assert_eq!(t.stack_frames(s1), Some(&[x, y][..]));

        t.reset();
        assert!(t.is_empty());
        // Old stack ids resolve to nothing, and new ones do not reuse them.
        assert_eq!(t.stack_frames(s1), None);
        assert_eq!(t.stack_frames(s2), None);
        let f = t.function(code("b", 1));
        let z = t.frame(f, None);
        let s3 = t.stack(&[z]);
        assert!(s3 != s1 && s3 != s2);
        assert_eq!(t.stack_frames(s3), Some(&[z][..]));
        assert!(t.resolve(s1).is_none());
        assert_eq!(&*t.resolve(s3).unwrap().next().unwrap().function.name, "b");
    }
}
