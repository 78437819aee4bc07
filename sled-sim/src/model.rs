//! The sans-IO project model a sled serves: stories moving through a pipeline.
//!
//! Everything here is deterministic: stories live in a [`BTreeMap`] keyed by their number, and
//! [`Project::seeded`] draws its demo content from a seeded ChaCha RNG.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Where a story is in the pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    Backlog,
    InProgress,
    Review,
    Done,
}

impl Stage {
    /// Every stage, in pipeline order.
    pub const ALL: [Stage; 4] = [
        Stage::Backlog,
        Stage::InProgress,
        Stage::Review,
        Stage::Done,
    ];

    /// The stage's wire name (`backlog`, `in_progress`, `review`, `done`).
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Backlog => "backlog",
            Stage::InProgress => "in_progress",
            Stage::Review => "review",
            Stage::Done => "done",
        }
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A string that is not one of the stage names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown stage {0:?} (expected one of backlog, in_progress, review, done)")]
pub struct UnknownStage(pub String);

impl FromStr for Stage {
    type Err = UnknownStage;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Stage::ALL
            .into_iter()
            .find(|stage| stage.as_str() == s)
            .ok_or_else(|| UnknownStage(s.to_owned()))
    }
}

/// One item of a story's todo list. Ids count from 1 within the story.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Todo {
    pub id: u64,
    pub text: String,
    pub done: bool,
}

/// One story of a project.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Story {
    /// `"<project>-<n>"`.
    pub id: String,
    /// The `n` of the id; also the creation order.
    pub number: u64,
    pub name: String,
    pub stage: Stage,
    pub acceptance_criteria: Vec<String>,
    pub todos: Vec<Todo>,
    pub next_todo_id: u64,
    /// `Some(reason)` while the story is blocked.
    pub blocked: Option<String>,
    /// The latest result of each test, by test name.
    pub tests: BTreeMap<String, bool>,
    pub origin: Option<String>,
}

impl Story {
    /// Appends a todo and returns it.
    pub fn add_todo(&mut self, text: impl Into<String>) -> &Todo {
        let id = self.next_todo_id;
        self.next_todo_id += 1;
        self.todos.push(Todo {
            id,
            text: text.into(),
            done: false,
        });
        // Just pushed, so the list is not empty.
        &self.todos[self.todos.len() - 1]
    }

    /// Marks a todo done. Returns the todo and whether it was already done, or `None` for an
    /// unknown todo id.
    pub fn complete_todo(&mut self, todo_id: u64) -> Option<(&Todo, bool)> {
        let todo = self.todos.iter_mut().find(|t| t.id == todo_id)?;
        let was_done = todo.done;
        todo.done = true;
        Some((todo, was_done))
    }

    /// Records the latest result of a test (replacing an earlier result of the same test).
    pub fn record_test(&mut self, test: impl Into<String>, passed: bool) {
        self.tests.insert(test.into(), passed);
    }

    /// The names of the tests whose latest result failed, sorted.
    pub fn failing_tests(&self) -> Vec<&str> {
        self.tests
            .iter()
            .filter(|(_, passed)| !**passed)
            .map(|(name, _)| name.as_str())
            .collect()
    }

    /// How many todos are done.
    pub fn todos_done(&self) -> usize {
        self.todos.iter().filter(|t| t.done).count()
    }

    /// The full story as JSON (what `show` returns).
    pub fn to_json(&self) -> Value {
        let tests: Vec<Value> = self
            .tests
            .iter()
            .map(|(name, passed)| json!({ "name": name, "passed": passed }))
            .collect();
        json!({
            "id": self.id,
            "name": self.name,
            "stage": self.stage,
            "acceptance_criteria": self.acceptance_criteria,
            "todos": self.todos,
            "blocked": self.blocked.is_some(),
            "blocked_reason": self.blocked,
            "tests": tests,
            "failing_tests": self.failing_tests(),
            "origin": self.origin,
            "created": self.number,
        })
    }

    /// A one-line summary (what `list_stories` returns per story).
    pub fn summary_json(&self) -> Value {
        json!({
            "id": self.id,
            "name": self.name,
            "stage": self.stage,
            "blocked": self.blocked.is_some(),
            "todos_done": self.todos_done(),
            "todos_total": self.todos.len(),
            "failing_tests": self.failing_tests().len(),
        })
    }
}

/// One project: its stories, keyed by story number (so iteration is creation order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Project {
    pub name: String,
    pub stories: BTreeMap<u64, Story>,
    /// The number the next story gets.
    pub next_id: u64,
}

const SEED_TITLES: [&str; 12] = [
    "Fix login bug",
    "Add dark mode",
    "Speed up cold start",
    "Export reports as CSV",
    "Rate-limit the public API",
    "Migrate settings to TOML",
    "Retry failed webhooks",
    "Audit log for admin actions",
    "Paginate the search results",
    "Upgrade the TLS library",
    "Flaky test in checkout flow",
    "Document the deploy runbook",
];

const SEED_CRITERIA: [&str; 6] = [
    "covered by a test",
    "documented in the changelog",
    "no regression in the benchmark",
    "reviewed by a second engineer",
    "works on a fresh install",
    "error messages name the failing input",
];

const SEED_TODOS: [&str; 6] = [
    "write the failing test",
    "implement the fix",
    "update the docs",
    "ask for review",
    "check the metrics dashboard",
    "clean up the feature flag",
];

const SEED_BLOCKERS: [&str; 3] = [
    "waiting on design",
    "needs a decision from ops",
    "upstream dependency broken",
];

impl Project {
    /// An empty project.
    pub fn new(name: impl Into<String>) -> Self {
        Project {
            name: name.into(),
            stories: BTreeMap::new(),
            next_id: 1,
        }
    }

    /// A project with 0–4 stories drawn deterministically from `seed`, so a fresh demo has
    /// something to show. The same `(name, seed)` always gives the same project.
    pub fn seeded(name: impl Into<String>, seed: u64) -> Self {
        let mut project = Project::new(name);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let count = rng.random_range(0..=4usize);
        // Distinct titles: draw without replacement.
        let mut titles: Vec<&str> = SEED_TITLES.to_vec();
        for _ in 0..count {
            let title = titles.remove(rng.random_range(0..titles.len()));
            let criteria_count = rng.random_range(1..=3usize);
            let start = rng.random_range(0..SEED_CRITERIA.len());
            let criteria: Vec<String> = (0..criteria_count)
                .map(|i| SEED_CRITERIA[(start + i) % SEED_CRITERIA.len()].to_owned())
                .collect();
            let number = project
                .create_story(title, criteria, Some("seed".to_owned()))
                .number;
            let stage = Stage::ALL[rng.random_range(0..Stage::ALL.len())];
            let todo_count = rng.random_range(0..=3usize);
            let todo_start = rng.random_range(0..SEED_TODOS.len());
            let blocked = rng.random_bool(0.25);
            let blocker = SEED_BLOCKERS[rng.random_range(0..SEED_BLOCKERS.len())];
            let test_passed = rng.random_bool(0.7);
            let Some(story) = project.stories.get_mut(&number) else {
                continue;
            };
            story.stage = stage;
            for i in 0..todo_count {
                story.add_todo(SEED_TODOS[(todo_start + i) % SEED_TODOS.len()]);
            }
            if stage == Stage::Done {
                for todo in &mut story.todos {
                    todo.done = true;
                }
            } else if todo_count > 1 && stage != Stage::Backlog {
                story.todos[0].done = true;
            }
            if stage != Stage::Backlog {
                story.record_test("unit", test_passed || stage == Stage::Done);
            }
            if blocked && stage != Stage::Done {
                story.blocked = Some(blocker.to_owned());
            }
        }
        project
    }

    /// Creates a story in the backlog and returns it.
    pub fn create_story(
        &mut self,
        name: impl Into<String>,
        acceptance_criteria: Vec<String>,
        origin: Option<String>,
    ) -> &Story {
        let number = self.next_id;
        self.next_id += 1;
        let story = Story {
            id: format!("{}-{}", self.name, number),
            number,
            name: name.into(),
            stage: Stage::Backlog,
            acceptance_criteria,
            todos: Vec::new(),
            next_todo_id: 1,
            blocked: None,
            tests: BTreeMap::new(),
            origin,
        };
        self.stories.entry(number).or_insert(story)
    }

    /// The number of a story id of this project (`"beta-3"` → 3 in project `beta`), if it has
    /// the right shape. Does not check that the story exists.
    pub fn parse_story_id(&self, id: &str) -> Option<u64> {
        let rest = id.strip_prefix(self.name.as_str())?.strip_prefix('-')?;
        if rest.is_empty() || !rest.bytes().all(|b| b.is_ascii_digit()) || rest.starts_with('0') {
            return None;
        }
        rest.parse().ok()
    }

    /// The story with this id, if it exists.
    pub fn story(&self, id: &str) -> Option<&Story> {
        self.stories.get(&self.parse_story_id(id)?)
    }

    /// The story with this id, mutably, if it exists.
    pub fn story_mut(&mut self, id: &str) -> Option<&mut Story> {
        let number = self.parse_story_id(id)?;
        self.stories.get_mut(&number)
    }

    /// All stories in creation order.
    pub fn iter(&self) -> impl Iterator<Item = &Story> {
        self.stories.values()
    }

    /// The ids of all stories, in creation order.
    pub fn story_ids(&self) -> Vec<&str> {
        self.stories.values().map(|s| s.id.as_str()).collect()
    }

    /// How many stories are in each stage (every stage present, in pipeline order).
    pub fn stage_counts(&self) -> BTreeMap<Stage, usize> {
        let mut counts: BTreeMap<Stage, usize> = Stage::ALL.iter().map(|s| (*s, 0)).collect();
        for story in self.stories.values() {
            *counts.entry(story.stage).or_insert(0) += 1;
        }
        counts
    }
}

pub use sled_uplink::fences::Fences;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_is_deterministic_and_small() {
        for seed in 0..50 {
            let a = Project::seeded("beta", seed);
            let b = Project::seeded("beta", seed);
            assert_eq!(a, b);
            assert!(a.stories.len() <= 4);
            for (i, story) in a.iter().enumerate() {
                assert_eq!(story.id, format!("beta-{}", i + 1));
                assert_eq!(story.origin.as_deref(), Some("seed"));
            }
        }
        let sizes: std::collections::BTreeSet<usize> = (0..50)
            .map(|s| Project::seeded("x", s).stories.len())
            .collect();
        assert!(
            sizes.len() >= 3,
            "seeds should give varied projects: {sizes:?}"
        );
    }

    #[test]
    fn seeded_content_is_pinned() {
        // A change here changes every demo and every simulation seed's starting state.
        let summary = |seed| {
            Project::seeded("alpha", seed)
                .iter()
                .map(|s| format!("{}:{}", s.name, s.stage))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            summary(0),
            vec![
                "Paginate the search results:review",
                "Rate-limit the public API:done",
                "Upgrade the TLS library:review",
            ]
        );
        assert_eq!(summary(5), vec!["Speed up cold start:in_progress"]);
        assert!(summary(2).is_empty());
    }

    #[test]
    fn story_ids_parse_only_for_this_project() {
        let mut p = Project::new("project-25");
        p.create_story("a", vec![], None);
        assert_eq!(p.parse_story_id("project-25-1"), Some(1));
        assert!(p.story("project-25-1").is_some());
        assert_eq!(p.parse_story_id("project-2-1"), None);
        assert_eq!(p.parse_story_id("project-25-"), None);
        assert_eq!(p.parse_story_id("project-25-01"), None);
        assert_eq!(p.parse_story_id("project-25-+1"), None);
        assert_eq!(p.parse_story_id("project-25-99999999999999999999999"), None);
        assert!(p.story("project-25-2").is_none());
    }

    #[test]
    fn todos_and_tests() {
        let mut p = Project::new("a");
        let id = p.create_story("s", vec!["c".into()], None).id.clone();
        let story = p.story_mut(&id).unwrap();
        assert_eq!(story.add_todo("one").id, 1);
        assert_eq!(story.add_todo("two").id, 2);
        assert_eq!(
            story.complete_todo(2).map(|(t, was)| (t.id, was)),
            Some((2, false))
        );
        assert_eq!(story.complete_todo(2).map(|(_, was)| was), Some(true));
        assert!(story.complete_todo(3).is_none());
        story.record_test("t1", false);
        story.record_test("t2", true);
        assert_eq!(story.failing_tests(), vec!["t1"]);
        story.record_test("t1", true);
        assert!(story.failing_tests().is_empty());
        assert_eq!("in_progress".parse::<Stage>(), Ok(Stage::InProgress));
        assert!("doing".parse::<Stage>().is_err());
    }

    #[test]
    fn fences_refuse_only_below_the_highest_of_their_resource() {
        let mut f = Fences::default();
        assert_eq!(f.high_water(), None);
        // (resource, fence, admitted or the highest that refused it)
        for (resource, fence, outcome) in [
            ("story:a-1", 5, Ok(())),
            ("story:a-1", 5, Ok(())),
            ("story:a-1", 4, Err(5)),
            ("story:a-1", 9, Ok(())),
            ("story:a-1", 5, Err(9)),
            ("story:a-2", 2, Ok(())),
            ("story:a-2", 1, Err(2)),
        ] {
            assert_eq!(f.admit(resource, fence), outcome, "{resource} {fence}");
        }
        assert_eq!(
            (
                f.highest("story:a-1"),
                f.highest("story:a-2"),
                f.highest("story:a-3")
            ),
            (Some(9), Some(2), None)
        );
        assert_eq!(f.high_water(), Some(9));
    }
}
