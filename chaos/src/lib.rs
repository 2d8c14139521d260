//! fault injectors, recorded workloads and a linearizability checker
