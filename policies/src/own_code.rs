//! Whose code a frame runs: the program's own, or a library's (the standard library, an
//! installed package, frozen or generated code). Views that answer "where does a request spend
//! its time" start at the first frame of the program's own code: the endpoint, not the
//! server's and framework's frames above it, which every request shares.
//!
//! By the file's path alone: a library's lies under `site-packages` or `dist-packages`, or
//! in an interpreter's `lib/pythonX.Y` directory; a name in angle brackets (`<frozen ...>`,
//! `<string>`, `<asyncio task>`) is no program file; nor is an installed command's launcher,
//! a file without `.py` in a `bin` directory (`venv/bin/gunicorn`, `/usr/bin/celery`: what
//! pip writes for a package's entry point). Anything else is the program's.

/// Whether a frame of `file` runs the program's own code (see the module documentation).
pub fn is_own_code(file: &str) -> bool {
    if file.is_empty() || file.starts_with('<') {
        return false;
    }
    let parts: Vec<&str> = file.split(['/', '\\']).collect();
    let launcher = parts.len() >= 2
        && matches!(parts[parts.len() - 2], "bin" | "Scripts")
        && !parts[parts.len() - 1].ends_with(".py");
    !launcher
        && !parts.iter().enumerate().any(|(i, part)| {
            matches!(*part, "site-packages" | "dist-packages")
                || (is_interpreter_lib(part) && i > 0 && matches!(parts[i - 1], "lib" | "lib64"))
        })
}

/// `pythonX.Y` (or `pythonX.Yt`): an interpreter's library directory's name.
fn is_interpreter_lib(name: &str) -> bool {
    let Some(version) = name.strip_prefix("python") else {
        return false;
    };
    let version = version.strip_suffix('t').unwrap_or(version);
    let mut numbers = version.split('.');
    let number =
        |n: Option<&str>| n.is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    number(numbers.next()) && number(numbers.next()) && numbers.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libraries_and_the_programs_own_code() {
        for library in [
            "/usr/lib/python3.14/asyncio/tasks.py",
            "/root/.pyenv/versions/3.13.1/lib/python3.13/threading.py",
            "/usr/lib64/python3.12/json/encoder.py",
            "/srv/venv/lib/python3.15/site-packages/starlette/routing.py",
            "/usr/lib/python3/dist-packages/gunicorn/arbiter.py",
            "<frozen runpy>",
            "<asyncio task>",
            "/root/.cache/pyfleet/venvs/gunicorn-3.15/bin/gunicorn",
            "/usr/bin/celery",
            "",
        ] {
            assert!(!is_own_code(library), "{library}");
        }
        for own in [
            "/srv/app/orders.py",
            "app.py",
            "/home/me/python3.14/app.py",
            "/srv/lib/python/app.py",
            "/srv/lib/python3.x/app.py",
            "/srv/lib/packages/app.py",
            "/home/me/bin/tool.py",
        ] {
            assert!(is_own_code(own), "{own}");
        }
    }
}
