//! The test programs' command lines (`--name value` flags) and their
//! failure line: `FAIL msg` on stdout and exit status 1, which the tests
//! and guest scripts read.

/// Prints `FAIL msg` and exits 1.
pub fn fail(msg: &str) -> ! {
    println!("FAIL {msg}");
    std::process::exit(1)
}

/// The value after `name` in `args`, else `default`; fails without either.
pub fn value(args: &[String], name: &str, default: Option<&str>) -> String {
    match args.iter().position(|a| a == name) {
        Some(i) if i + 1 < args.len() => args[i + 1].clone(),
        _ => default
            .unwrap_or_else(|| fail(&format!("missing {name}")))
            .to_string(),
    }
}

/// `value` as a number.
pub fn number(args: &[String], name: &str, default: Option<&str>) -> u64 {
    value(args, name, default)
        .parse()
        .unwrap_or_else(|_| fail(&format!("{name} wants a number")))
}
