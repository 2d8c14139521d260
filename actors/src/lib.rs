//! the node's actors, each a pure core plus a thin actix shell
