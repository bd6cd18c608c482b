mod replication {
    use std::time::Instant;
    use stateright::{Checker, Model};
    use trireme_spec::replication::{Config, ReplicationModel, Start};

    fn env_u8(name: &str, default: u8) -> u8 {
        std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
    }

    #[test]
    fn explore() {
        let mut config = Config::quiet("explore");
        config.start = [Start::Empty, Start::Sent, Start::Received, Start::Deleted][env_u8("X_SENT", 0) as usize];
        config.dead_letter = env_u8("X_DLQ", 0) == 1;
        config.max_receive_count = 1;
        config.faults_max = env_u8("X_FAULTS", 1);
        config.claims_max = env_u8("X_CLAIMS", 2);
        config.deletes_max = env_u8("X_DELETES", 1);
        config.collects_max = env_u8("X_COLLECTS", 1);
        config.redrives_max = env_u8("X_REDRIVES", 0);
        config.horizons_max = env_u8("X_HORIZONS", 1);
        config.anti_entropy_max = env_u8("X_AE", 1);
        config.replacements_max = env_u8("X_REPL", 0);
        config.heal = env_u8("X_HEAL", 1) == 1;
        let started = Instant::now();
        let checker = ReplicationModel::new(config).checker().target_state_count(env_u8("X_MSTATES", 40) as usize * 1_000_000).spawn_bfs().join();
        println!(
            "states {} unique {} depth {} in {:?}",
            checker.state_count(),
            checker.unique_state_count(),
            checker.max_depth(),
            started.elapsed()
        );
        for (name, path) in checker.discoveries() {
            println!("discovery: {name}");
            if name == std::env::var("X_SHOW").unwrap_or("~".into()) {
                for (state, action) in path.clone().into_vec() {
                    println!("  {:?}\n      net={:?}\n      coords={:?}", state.replicas.iter().map(|r| (r.up, r.store[0], r.store[1])).collect::<Vec<_>>(), state.network.iter().map(|p| (p.replica, p.coordinator, p.round, p.message)).collect::<Vec<_>>(), state.coordinators.iter().map(|c| (c.op, c.handle)).collect::<Vec<_>>());
                    println!("  --> {action:?}");
                }
                println!("  final ghost {:?}", path.last_state().ghost);
            }
        }
    }
}
