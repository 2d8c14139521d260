//! `yard`: the Switchyard node daemon. This library half holds what the binary and the tests
//! share: configuration, the PKI, the frame codec, the transports, Raft's network, the request
//! handler and the admin client.

pub mod admin_actor;
pub mod admission;
pub mod agg_agent;
pub mod agg_bandwidth;
pub mod agg_control;
pub mod agg_feed;
pub mod agg_service;
pub mod alert;
pub mod batcher;
pub mod ca_rotation;
pub mod client;
pub mod config;
pub mod data_dir;
pub mod diagnosis_control;
pub mod diagnosis_service;
pub mod dispatch;
pub mod frame;
pub mod gateway_control;
pub mod gateway_loop;
pub mod gateway_service;
pub mod gauges;
pub mod http;
pub mod latency;
pub mod limits;
pub mod metrics;
pub mod operator_proof;
pub mod pki;
pub mod planner_control;
pub mod planner_report;
pub mod prevote;
pub mod raft_network;
pub mod raft_wait;
pub mod renewal;
pub mod roles;
pub mod rpc;
pub mod service;
pub mod sink_tickets;
pub mod snapshot_service;
pub mod stale_raft;
pub mod tls;
pub mod transport;
