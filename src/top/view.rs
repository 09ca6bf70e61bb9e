//! `pyfleet top`'s screen (ratatui): a header (what is profiled, how, for how long; the
//! scope's samples on a CPU, holding and waiting for the GIL), the table of functions, and a
//! line of keys; and what each key does ([`ViewState::key`]). Every target string goes
//! through [`for_terminal`](crate::output::for_terminal) before it is drawn.

use super::model::{Row, Scope, SortKey, Summary, TopModel};
use crate::output::for_terminal;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Cell, Paragraph, Row as TableRow, Table};
use ratatui::Frame;

/// What the user chose: scope, order, filter.
#[derive(Debug, Clone)]
pub struct ViewState {
    pub scope: Scope,
    pub sort: SortKey,
    pub filter: String,
    /// Typing a filter (after `/`, until Enter or Esc).
    pub editing: bool,
    pub quit: bool,
    /// The counts are to start afresh (`r`).
    pub reset: bool,
}

impl Default for ViewState {
    fn default() -> Self {
        ViewState {
            scope: Scope::Fleet,
            sort: SortKey::Own,
            filter: String::new(),
            editing: false,
            quit: false,
            reset: false,
        }
    }
}

/// Longest filter typed.
const MAX_FILTER: usize = 64;

impl ViewState {
    /// Acts on one key; `pids`: the processes counted, to step through with Tab.
    pub fn key(&mut self, k: KeyEvent, pids: &[i32]) {
        if k.modifiers.contains(KeyModifiers::CONTROL) && k.code == KeyCode::Char('c') {
            self.quit = true;
            return;
        }
        if self.editing {
            match k.code {
                KeyCode::Enter => self.editing = false,
                KeyCode::Esc => {
                    self.editing = false;
                    self.filter.clear();
                }
                KeyCode::Backspace => {
                    self.filter.pop();
                }
                KeyCode::Char(c) if !c.is_control() && self.filter.chars().count() < MAX_FILTER => {
                    self.filter.push(c)
                }
                _ => {}
            }
            return;
        }
        match k.code {
            KeyCode::Char('q') | KeyCode::Esc => self.quit = true,
            KeyCode::Char('o') => self.sort = SortKey::Own,
            KeyCode::Char('t') => self.sort = SortKey::Total,
            KeyCode::Char('n') => self.sort = SortKey::Name,
            KeyCode::Char('/') => {
                self.editing = true;
                self.filter.clear();
            }
            KeyCode::Char('r') => self.reset = true,
            KeyCode::Tab => self.scope = next_scope(self.scope, pids, true),
            KeyCode::BackTab => self.scope = next_scope(self.scope, pids, false),
            _ => {}
        }
    }
}

/// The fleet, then each process in pid order, round.
fn next_scope(scope: Scope, pids: &[i32], forward: bool) -> Scope {
    let mut all = vec![Scope::Fleet];
    all.extend(pids.iter().map(|&p| Scope::Process(p)));
    let at = all.iter().position(|s| *s == scope).unwrap_or(0);
    let n = all.len();
    all[match forward {
        true => (at + 1) % n,
        false => (at + n - 1) % n,
    }]
}

/// What the header says besides the counts: what is profiled and how.
pub struct Header {
    pub what: String,
    pub how: String,
    pub seconds: f64,
    pub rate_hz: Option<f64>,
}

fn percent(n: u64, of: u64) -> f64 {
    100.0 * n as f64 / of.max(1) as f64
}

/// Draws the whole screen.
pub fn draw(frame: &mut Frame, model: &TopModel, state: &ViewState, header: &Header) {
    let [head, table, keys] = Layout::vertical([
        Constraint::Length(3),
        Constraint::Min(1),
        Constraint::Length(1),
    ])
    .areas(frame.area());
    let summary: Summary = model.summary(state.scope);
    let scope = match state.scope {
        Scope::Fleet => match summary.processes {
            1 => "1 process".to_string(),
            n => format!("all {n} processes"),
        },
        Scope::Process(pid) => {
            let name = model
                .processes()
                .into_iter()
                .find(|(p, _)| *p == pid)
                .map_or(String::new(), |(_, n)| n.to_string());
            format!("pid {pid} {}", for_terminal(&name))
        }
    };
    let filter = match (state.editing, state.filter.is_empty()) {
        (true, _) => format!("   filter: {}_", for_terminal(&state.filter)),
        (false, false) => format!("   filter: {}", for_terminal(&state.filter)),
        (false, true) => String::new(),
    };
    let lines = vec![
        Line::from(format!(
            "pyfleet top: {} — {}; {:.0} s",
            for_terminal(&header.what),
            header.how,
            header.seconds
        )),
        Line::from(format!(
            "{scope}: {} samples, of which on a CPU {:.1}%   holding the GIL {:.1}%   waiting \
             for it {:.1}%",
            summary.samples,
            percent(summary.on_cpu, summary.samples),
            percent(summary.holds_gil, summary.samples),
            percent(summary.waits_gil, summary.samples),
        )),
        Line::from(format!("sort: {}{filter}", state.sort.as_str())),
    ];
    frame.render_widget(Paragraph::new(lines), head);

    let rows: Vec<Row> = model.rows(state.scope, state.sort, &state.filter);
    // The rate the samples were taken at, else the rate asked.
    let seconds = |n: u64| match summary.rate_hz.or(header.rate_hz) {
        Some(hz) if hz > 0.0 => format!("{:.2}", n as f64 / hz),
        _ => "-".to_string(),
    };
    let height = table.height.saturating_sub(1) as usize;
    let body = rows.iter().take(height).map(|r| {
        TableRow::new(vec![
            Cell::from(format!("{:6.1}", 100.0 * r.own_share)),
            Cell::from(format!("{:6.1}", 100.0 * r.total_share)),
            Cell::from(format!("{:>8}", seconds(r.own))),
            Cell::from(format!("{:>8}", seconds(r.total))),
            Cell::from(for_terminal(&r.shown()).into_owned()),
        ])
    });
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let widths = [
        Constraint::Length(6),
        Constraint::Length(7),
        Constraint::Length(8),
        Constraint::Length(9),
        Constraint::Min(10),
    ];
    let t = Table::new(body, widths).header(
        TableRow::new(vec![
            "  %Own",
            " %Total",
            "  Own(s)",
            " Total(s)",
            "Function (file)",
        ])
        .style(bold),
    );
    frame.render_widget(t, table);
    frame.render_widget(
        Paragraph::new(
            "q quit   o/t/n sort by own, total, name   / filter   Tab next process   r reset",
        )
        .style(Style::default().add_modifier(Modifier::REVERSED)),
        keys,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratatui::crossterm::event::KeyEventKind;
    use ratatui::crossterm::event::KeyEventState;

    fn key(code: KeyCode) -> KeyEvent {
        KeyEvent {
            code,
            modifiers: KeyModifiers::NONE,
            kind: KeyEventKind::Press,
            state: KeyEventState::NONE,
        }
    }

    #[test]
    fn keys_sort_filter_step_through_processes_and_quit() {
        let mut s = ViewState::default();
        s.key(key(KeyCode::Char('t')), &[]);
        assert_eq!(s.sort, SortKey::Total);
        s.key(key(KeyCode::Char('/')), &[]);
        for c in "fib".chars() {
            s.key(key(KeyCode::Char(c)), &[]);
        }
        // While typing, q is a letter.
        s.key(key(KeyCode::Char('q')), &[]);
        s.key(key(KeyCode::Backspace), &[]);
        s.key(key(KeyCode::Enter), &[]);
        assert_eq!(
            (s.filter.as_str(), s.editing, s.quit),
            ("fib", false, false)
        );
        s.key(key(KeyCode::Tab), &[7, 9]);
        assert_eq!(s.scope, Scope::Process(7));
        s.key(key(KeyCode::BackTab), &[7, 9]);
        s.key(key(KeyCode::BackTab), &[7, 9]);
        assert_eq!(s.scope, Scope::Process(9));
        s.key(key(KeyCode::Char('q')), &[]);
        assert!(s.quit);
    }

    #[test]
    fn the_screen_shows_the_hottest_function_first_and_hostile_names_as_text() {
        use pyfleet_actors::{FrameInfo, ThreadStatus};
        let mut m = TopModel::default();
        let on = ThreadStatus {
            on_cpu: true,
            holds_gil: true,
            waits_gil: false,
        };
        m.add(1, "web", on, &[FrameInfo::new("hot", "/a.py", Some(1))], 7);
        m.add(
            1,
            "web",
            on,
            &[FrameInfo::new("evil\x1b[2J", "/a.py", Some(1))],
            3,
        );
        let backend = ratatui::backend::TestBackend::new(100, 12);
        let mut terminal = ratatui::Terminal::new(backend).unwrap();
        let header = Header {
            what: "pid 1".into(),
            how: "cpu mode at 100 Hz".into(),
            seconds: 1.0,
            rate_hz: Some(100.0),
        };
        terminal
            .draw(|f| draw(f, &m, &ViewState::default(), &header))
            .unwrap();
        let screen: String = terminal
            .backend()
            .buffer()
            .content()
            .iter()
            .map(|c| c.symbol())
            .collect();
        let hot = screen.find("hot (a.py)").expect("the hot function");
        let evil = screen.find("evil").expect("the other");
        assert!(hot < evil, "{screen}");
        assert!(screen.contains("70.0"), "{screen}");
        assert!(!screen.contains('\x1b'), "{screen}");
    }
}
