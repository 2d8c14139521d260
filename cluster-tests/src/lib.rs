//! network-namespace test hosts running real yard processes
