//! Completion of `kubectl tt driver` words, for kubectl's plugin completion
//! (kubectl 1.26+ runs `kubectl_complete-tt <words after "tt">` and shows the
//! lines it prints). Pure: the command tree from clap, the policy and node
//! names from closures the caller fills from the cluster.

use clap::Command;

/// cobra's ShellCompDirectiveNoFileComp: the shell offers no file names.
pub const NO_FILE_COMP: &str = ":4";

/// Subcommands whose first positional is a policy, and those whose second is
/// one of its nodes.
const POLICY_FIRST: &[&str] = &[
    "status", "nodes", "watch", "plan", "pause", "resume", "retry", "restart", "logs", "handback",
];
const NODE_SECOND: &[&str] = &["retry", "restart", "logs"];

/// The candidates for the last of `words` (the words after `kubectl tt`; a
/// leading `driver` is skipped), each on a line, then [`NO_FILE_COMP`].
pub fn candidates(
    cmd: &Command,
    words: &[String],
    policies: &dyn Fn() -> Vec<String>,
    nodes: &dyn Fn(&str) -> Vec<String>,
) -> Vec<String> {
    let words = match words.first().map(String::as_str) {
        Some("driver") => &words[1..],
        _ => words,
    };
    let (done, current) = match words.split_last() {
        Some((last, rest)) => (rest, last.as_str()),
        None => (&[][..], ""),
    };
    let mut sub: Option<&Command> = None;
    let mut positionals: Vec<&str> = Vec::new();
    let mut expect_value_of: Option<String> = None;
    for w in done {
        if expect_value_of.take().is_some() {
            continue;
        }
        if let Some(flag) = w.strip_prefix("--") {
            if !flag.contains('=') && takes_value(cmd, sub, flag, None) {
                expect_value_of = Some(flag.to_string());
            }
        } else if let Some(short) = w.strip_prefix('-').filter(|s| s.len() == 1) {
            let c = short.chars().next().unwrap_or('-');
            if takes_value(cmd, sub, "", Some(c)) {
                expect_value_of = Some(short.to_string());
            }
        } else if sub.is_none() {
            sub = cmd.find_subcommand(w.as_str());
            if sub.is_none() {
                positionals.push(w);
            }
        } else {
            positionals.push(w);
        }
    }
    let mut out: Vec<String> = if let Some(flag) = expect_value_of {
        values_of(cmd, sub, &flag)
    } else if current.starts_with('-') {
        flags(cmd, sub)
    } else {
        match sub.map(Command::get_name) {
            None => cmd
                .get_subcommands()
                .filter(|s| !s.is_hide_set())
                .map(|s| s.get_name().to_string())
                .collect(),
            Some(name) if POLICY_FIRST.contains(&name) && positionals.is_empty() => policies(),
            Some(name) if NODE_SECOND.contains(&name) && positionals.len() == 1 => {
                nodes(positionals[0])
            }
            Some("completion") if positionals.is_empty() => {
                ["bash", "zsh", "fish"].map(String::from).to_vec()
            }
            Some(_) => Vec::new(),
        }
    };
    out.retain(|c| c.starts_with(current));
    out.sort();
    out.dedup();
    out.push(NO_FILE_COMP.to_string());
    out
}

fn args<'a>(cmd: &'a Command, sub: Option<&'a Command>) -> impl Iterator<Item = &'a clap::Arg> {
    cmd.get_arguments()
        .chain(sub.into_iter().flat_map(Command::get_arguments))
        .filter(|a| !a.is_positional() && !a.is_hide_set())
}

fn find<'a>(cmd: &'a Command, sub: Option<&'a Command>, name: &str) -> Option<&'a clap::Arg> {
    args(cmd, sub).find(|a| {
        a.get_long() == Some(name)
            || (name.len() == 1 && a.get_short().map(String::from).as_deref() == Some(name))
    })
}

fn takes_value(cmd: &Command, sub: Option<&Command>, long: &str, short: Option<char>) -> bool {
    let name = short.map(String::from).unwrap_or_else(|| long.to_string());
    find(cmd, sub, &name).is_some_and(|a| a.get_action().takes_values())
}

fn flags(cmd: &Command, sub: Option<&Command>) -> Vec<String> {
    args(cmd, sub)
        .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
        .filter(|l| l != "--help" && l != "--version")
        .collect()
}

fn values_of(cmd: &Command, sub: Option<&Command>, flag: &str) -> Vec<String> {
    find(cmd, sub, flag)
        .map(|a| {
            a.get_possible_values()
                .iter()
                .map(|v| v.get_name().to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Cli;
    use clap::CommandFactory;

    fn complete(line: &str) -> Vec<String> {
        let mut words: Vec<String> = line.split(' ').map(String::from).collect();
        if line.is_empty() {
            words = vec![String::new()];
        }
        let cmd = Cli::command();
        let mut out = candidates(
            &cmd,
            &words,
            &|| vec!["fleet".into(), "canary".into()],
            &|p| match p {
                "fleet" => vec!["n1".into(), "n2".into()],
                _ => vec![],
            },
        );
        assert_eq!(out.pop().as_deref(), Some(NO_FILE_COMP), "{line}");
        out
    }

    #[test]
    fn subcommands_after_driver() {
        let all = complete("driver ");
        for s in ["status", "watch", "plan", "retry", "completion", "logs"] {
            assert!(all.contains(&s.to_string()), "{s} in {all:?}");
        }
        assert!(!all.iter().any(|s| s.starts_with("__")), "hidden: {all:?}");
        assert_eq!(complete("driver wa"), ["watch"]);
        assert_eq!(complete("driver re"), ["restart", "resume", "retry"]);
    }

    #[test]
    fn policies_then_nodes() {
        assert_eq!(complete("driver watch "), ["canary", "fleet"]);
        assert_eq!(complete("driver -n ops retry f"), ["fleet"]);
        assert_eq!(complete("driver retry fleet "), ["n1", "n2"]);
        assert_eq!(complete("driver retry fleet n1 "), Vec::<String>::new());
        assert_eq!(complete("driver completion "), ["bash", "fish", "zsh"]);
    }

    #[test]
    fn flags_and_their_values() {
        let f = complete("driver status --");
        for flag in ["--kubeconfig", "--context", "--namespace", "--output"] {
            assert!(f.contains(&flag.to_string()), "{flag} in {f:?}");
        }
        assert_eq!(complete("driver -o "), ["json", "text", "yaml"]);
        assert_eq!(complete("driver status --color a"), ["always", "auto"]);
        // A flag's value is not taken for the subcommand.
        assert_eq!(complete("driver --context prod wat"), ["watch"]);
    }
}
