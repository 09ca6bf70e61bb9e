//! Which system call a sleeping thread sleeps in, from `/proc/PID/task/TID/syscall` (the
//! kernel reads it off the stopped thread's registers: exact for a thread off its CPU, and
//! "running" for one on it). Reading it needs the ptrace access pyfleet has to read memory.

/// The futex word a thread of `pid` sleeps on, when it sleeps in `futex(2)` (a lock, a
/// condition variable: CPython's GIL waits in one). `None` when it runs, sleeps elsewhere, is
/// gone, or the file cannot be read.
pub fn futex_word(pid: i32, tid: i32) -> Option<u64> {
    let text = std::fs::read(format!("/proc/{pid}/task/{tid}/syscall")).ok()?;
    futex_word_in(&text)
}

/// The futex word named by the contents of a `syscall` file: the system call's number, then
/// its six arguments and the stack and instruction pointers, in hex.
pub fn futex_word_in(text: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(text).ok()?;
    let mut fields = text.split_ascii_whitespace();
    let number: i64 = fields.next()?.parse().ok()?;
    if number != libc::SYS_futex {
        return None;
    }
    let uaddr = fields.next()?.strip_prefix("0x")?;
    u64::from_str_radix(uaddr, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_futex_wait_names_its_word_and_anything_else_none() {
        let futex = format!(
            "{} 0x7f3a2c001f48 0x189 0x0 0x0 0x0 0xffffffff 0x7ffd5c1e0a80 0x7f3a2c8e1d7e\n",
            libc::SYS_futex
        );
        assert_eq!(futex_word_in(futex.as_bytes()), Some(0x7f3a_2c00_1f48));
        assert_eq!(futex_word_in(b"running\n"), None);
        assert_eq!(futex_word_in(b"-1 0x7ffd5c1e0a80 0x7f3a2c8e1d7e\n"), None);
        let read = format!(
            "{} 0x3 0x5612 0x1000 0x0 0x0 0x0 0x7ffd 0x7f3a\n",
            libc::SYS_read
        );
        assert_eq!(futex_word_in(read.as_bytes()), None);
        assert_eq!(futex_word_in(b""), None);
        assert_eq!(
            futex_word_in(format!("{} zz", libc::SYS_futex).as_bytes()),
            None
        );
    }

    /// This thread's id, from `/proc/thread-self` ("PID/task/TID").
    fn own_tid() -> i32 {
        let link = std::fs::read_link("/proc/thread-self").expect("/proc/thread-self");
        let text = link.to_string_lossy().into_owned();
        text.rsplit('/')
            .next()
            .and_then(|t| t.parse().ok())
            .expect("a thread id")
    }

    #[test]
    fn a_thread_waiting_on_a_condition_variable_names_its_word() {
        use std::sync::{Arc, Condvar, Mutex};
        let pair = Arc::new((Mutex::new((0i32, false)), Condvar::new()));
        let theirs = Arc::clone(&pair);
        let waiter = std::thread::spawn(move || {
            let (lock, cv) = &*theirs;
            let mut g = lock.lock().expect("lock");
            g.0 = own_tid();
            while !g.1 {
                g = cv.wait(g).expect("wait");
            }
        });
        let pid = std::process::id() as i32;
        let cv_at = &pair.1 as *const Condvar as u64;
        let cv_len = std::mem::size_of::<Condvar>() as u64;
        // The waiter publishes its id and sleeps; it is seen waiting within 10 s.
        let mut word = None;
        for _ in 0..1000 {
            let tid = pair.0.lock().expect("lock").0;
            if tid != 0 {
                word = futex_word(pid, tid).filter(|w| w.wrapping_sub(cv_at) < cv_len);
                if word.is_some() {
                    break;
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        pair.0.lock().expect("lock").1 = true;
        pair.1.notify_all();
        waiter.join().expect("waiter");
        assert!(
            word.is_some(),
            "the waiter was never seen in futex(2) on its condvar"
        );
        // This thread runs while it reads its own file.
        assert_eq!(futex_word(pid, own_tid()), None);
    }
}
