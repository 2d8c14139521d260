//! The checker on the project's own objects and on small C programs that each break one rule
//! (compiled by clang here, as the ebpf crate's build does), each refused for the right reason.

mod common;

use yard_offload::check::{Certainty, Finding, ProgramReport, Rule};
use yard_offload::elf::MapOrigin;
use yard_offload::{check_file, Error, Object, Profile, Report, Verdict};

const PRE: &str = r#"
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <bpf/bpf_helpers.h>
char LICENSE[] SEC("license") = "GPL";
"#;

fn check_c(name: &str, body: &str, profile: &str) -> Report {
    let dir = tempfile::tempdir().expect("tempdir");
    let obj = common::compile_str(name, &format!("{PRE}{body}"), dir.path(), &[]);
    check_file(&obj, &Profile::by_name(profile).expect("profile")).expect("parses")
}

fn only(r: &Report) -> &ProgramReport {
    assert_eq!(r.programs.len(), 1, "{}", r.human());
    &r.programs[0]
}

fn all_findings(p: &ProgramReport) -> Vec<&Finding> {
    p.findings
        .iter()
        .chain(p.functions.iter().flat_map(|f| f.findings.iter()))
        .collect()
}

/// The program is ineligible, and for the expected rule with a detail naming the cause.
fn assert_refused(r: &Report, rule: Rule, detail: &str) {
    let p = only(r);
    assert_eq!(p.verdict, Verdict::Ineligible, "{}", r.human());
    assert!(
        all_findings(p).iter().any(|f| f.rule == rule
            && f.certainty == Certainty::Definite
            && f.detail.contains(detail)),
        "no definite {rule:?} finding mentioning {detail:?}:\n{}",
        r.human()
    );
}

fn rules(p: &ProgramReport) -> Vec<Rule> {
    all_findings(p).iter().map(|f| f.rule).collect()
}

const PASS_MAP: &str = r#"
struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 4);
         __type(key, __u32); __type(value, __u64); } cnt SEC(".maps");
"#;

#[test]
fn gateway_on_nfp_is_refused_for_the_reasons_in_its_source() {
    let dir = tempfile::tempdir().expect("tempdir");
    let obj = common::gateway(dir.path());
    let r = check_file(&obj, &Profile::by_name("nfp").expect("nfp")).expect("parses");
    let p = only(&r);
    assert_eq!(p.name, "yard_gateway");
    assert_eq!(p.verdict, Verdict::Ineligible);
    // the gateway returns DROP, PASS and TX and nothing else
    assert_eq!(p.return_codes, vec![1, 2, 3]);
    assert!(!p.return_code_unknown);
    let f = all_findings(p);
    let has = |rule: Rule, s: &str| {
        f.iter()
            .any(|x| x.rule == rule && x.certainty == Certainty::Definite && x.detail.contains(s))
    };
    // every one of these is in gateway.bpf.c
    assert!(has(Rule::Helper, "bpf_fib_lookup (69)"), "{}", r.human());
    assert!(has(Rule::Helper, "bpf_ktime_get_ns (5)"), "{}", r.human());
    assert!(has(Rule::CtxAccess, "ingress_ifindex"), "{}", r.human());
    assert!(
        has(Rule::MapType, "gw_counters is percpu_array"),
        "{}",
        r.human()
    );
    assert!(has(Rule::MapWrite, "gw_counters"), "{}", r.human());
    // its maps: read from BTF, with the sizes of yard.h
    let m = |n: &str| r.maps.iter().find(|m| m.name == n).expect("map");
    assert_eq!(
        (m("gw_endpoints").key_size, m("gw_endpoints").value_size),
        (8, 12)
    );
    assert_eq!(m("gw_endpoints").max_entries, 262_144);
    assert_eq!(m("gw_config").origin, MapOrigin::Btf);
    assert!(m("gw_vips").offloadable && m("gw_hosts").offloadable);
    assert!(!m("gw_counters").offloadable);
    // the lookups of the VIP and endpoint tables use stack keys: no helper-argument finding
    assert!(!rules(p).contains(&Rule::HelperArg), "{}", r.human());
    // each finding names the source lines it comes from (BTF line info of the -g build)
    let source = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../ebpf/bpf/gateway.bpf.c"),
    )
    .expect("gateway source");
    let src_line = |at: &str| -> String {
        let (file, n) = at.rsplit_once(':').expect("file:line");
        assert_eq!(file, "gateway.bpf.c");
        let n: usize = n.parse().expect("a line number");
        source.lines().nth(n - 1).expect("line exists").to_owned()
    };
    let fib = f
        .iter()
        .find(|x| x.detail.contains("bpf_fib_lookup"))
        .expect("fib finding");
    assert!(
        fib.lines
            .iter()
            .any(|l| src_line(l).contains("bpf_fib_lookup(")),
        "{:?}",
        fib.lines
    );
    let ktime = f
        .iter()
        .find(|x| x.detail.contains("ktime"))
        .expect("ktime finding");
    assert!(
        ktime
            .lines
            .iter()
            .any(|l| src_line(l).contains("bpf_ktime_get_ns()")),
        "{:?}",
        ktime.lines
    );
    // ranges point at real instructions of the one function
    let func = &p.functions[0];
    assert_eq!(func.name, "yard_gateway");
    for x in &func.findings {
        for range in &x.ranges {
            assert!(func.start <= range[0] && range[1] < func.end);
        }
    }
}

#[test]
fn gateway_on_none_and_hxdp() {
    let dir = tempfile::tempdir().expect("tempdir");
    let obj = common::gateway(dir.path());
    let none = check_file(&obj, &Profile::by_name("none").expect("none")).expect("parses");
    let p = only(&none);
    assert_eq!(p.verdict, Verdict::Ineligible);
    assert_eq!(rules(p), vec![Rule::NoOffloadTarget]);
    let hx = check_file(&obj, &Profile::by_name("hxdp").expect("hxdp")).expect("parses");
    // hXDP (as modelled) has ktime and direct map writes, but no fib_lookup
    let f = all_findings(only(&hx));
    assert!(f.iter().any(|x| x.detail.contains("bpf_fib_lookup")));
    assert!(!f.iter().any(|x| x.detail.contains("ktime")));
    assert!(!f.iter().any(|x| x.rule == Rule::MapWrite));
}

#[test]
fn bounce_is_likely_eligible_on_nfp() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../ebpf/bpf/bounce.bpf.c");
    let obj = common::compile(&src, dir.path(), &[]);
    let r = check_file(&obj, &Profile::by_name("nfp").expect("nfp")).expect("parses");
    let p = only(&r);
    assert_eq!(p.verdict, Verdict::LikelyEligible, "{}", r.human());
    assert_eq!(p.return_codes, vec![1, 3]);
    assert_eq!(p.max_pkt_offset, 12);
}

#[test]
fn stack_key_lookup_and_atomic_add_are_likely_eligible() {
    let r = check_c(
        "ok",
        &format!(
            "{PASS_MAP}{}",
            r#"
SEC("xdp") int prog(struct xdp_md *ctx) {
    __u32 k = 1;
    __u64 *v = bpf_map_lookup_elem(&cnt, &k);
    if (v) __sync_fetch_and_add(v, 1);
    return XDP_PASS;
}"#
        ),
        "nfp",
    );
    assert_eq!(only(&r).verdict, Verdict::LikelyEligible, "{}", r.human());
}

#[test]
fn direct_map_value_store_is_refused() {
    let r = check_c(
        "mapwrite",
        &format!(
            "{PASS_MAP}{}",
            r#"
SEC("xdp") int prog(struct xdp_md *ctx) {
    __u32 k = 1;
    __u64 *v = bpf_map_lookup_elem(&cnt, &k);
    if (v) *v = 7;
    return XDP_PASS;
}"#
        ),
        "nfp",
    );
    assert_refused(&r, Rule::MapWrite, "value of map cnt");
}

const MOD_PROG: &str = r#"
SEC("xdp") int prog(struct xdp_md *ctx) {
    /* r0 %= 7 (ALU64 | MOD | K) as raw bytes: clang lowers '%' to div/mul/sub, and its BPF
       assembler has no '%=' */
    asm volatile(".byte 0x97, 0x00, 0, 0, 7, 0, 0, 0" ::: "r0");
    return XDP_PASS;
}"#;

#[test]
fn modulo_is_refused() {
    let r = check_c("modulo", MOD_PROG, "nfp");
    assert_refused(&r, Rule::Opcode, "alu64 mod k");
    // the hXDP model has MOD
    let hx = check_c("modh", MOD_PROG, "hxdp");
    assert!(!rules(only(&hx)).contains(&Rule::Opcode), "{}", hx.human());
}

#[test]
fn division_by_a_variable_is_refused() {
    let r = check_c(
        "divvar",
        r#"
SEC("xdp") int prog(struct xdp_md *ctx) {
    void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
    __u32 *p = data;
    if ((void *)(p + 2) > end) return XDP_DROP;
    return ((p[0] / (p[1] | 1)) & 1) ? XDP_PASS : XDP_DROP;
}"#,
        "nfp",
    );
    assert_refused(&r, Rule::MulDiv, "not a constant");
}

#[test]
fn redirect_helper_is_refused() {
    let r = check_c(
        "redirect",
        r#"SEC("xdp") int prog(struct xdp_md *ctx) { return bpf_redirect(3, 0); }"#,
        "nfp",
    );
    assert_refused(&r, Rule::Helper, "bpf_redirect (23)");
}

#[test]
fn returning_xdp_redirect_is_refused() {
    let r = check_c(
        "ret4",
        r#"SEC("xdp") int prog(struct xdp_md *ctx) { return XDP_REDIRECT; }"#,
        "nfp",
    );
    assert_refused(&r, Rule::ReturnCode, "XDP_REDIRECT (4)");
    assert_eq!(only(&r).return_codes, vec![4]);
    // hXDP honours redirect
    let hx = check_c(
        "ret4h",
        r#"SEC("xdp") int prog(struct xdp_md *ctx) { return XDP_REDIRECT; }"#,
        "hxdp",
    );
    assert_eq!(only(&hx).verdict, Verdict::LikelyEligible, "{}", hx.human());
}

#[test]
fn tail_call_is_refused() {
    let r = check_c(
        "tail",
        r#"
struct { __uint(type, BPF_MAP_TYPE_PROG_ARRAY); __uint(max_entries, 2);
         __type(key, __u32); __type(value, __u32); } jt SEC(".maps");
SEC("xdp") int prog(struct xdp_md *ctx) { bpf_tail_call(ctx, &jt, 0); return XDP_PASS; }"#,
        "nfp",
    );
    assert_refused(&r, Rule::Helper, "bpf_tail_call (12)");
    assert_refused(&r, Rule::MapType, "jt is prog_array");
}

#[test]
fn lru_map_is_refused() {
    let r = check_c(
        "lru",
        r#"
struct { __uint(type, BPF_MAP_TYPE_LRU_HASH); __uint(max_entries, 16);
         __type(key, __u32); __type(value, __u32); } lru SEC(".maps");
SEC("xdp") int prog(struct xdp_md *ctx) {
    __u32 k = 0;
    return bpf_map_lookup_elem(&lru, &k) ? XDP_PASS : XDP_DROP;
}"#,
        "nfp",
    );
    assert_refused(&r, Rule::MapType, "lru is lru_hash");
}

#[test]
fn oversized_map_element_is_refused() {
    let r = check_c(
        "bigval",
        r#"
struct big { __u64 w[8]; };
struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 16);
         __type(key, __u32); __type(value, struct big); } big SEC(".maps");
SEC("xdp") int prog(struct xdp_md *ctx) {
    __u32 k = 0;
    return bpf_map_lookup_elem(&big, &k) ? XDP_PASS : XDP_DROP;
}"#,
        "nfp",
    );
    // 8 (key rounded up) + 64 = 72 > 64
    assert_refused(&r, Rule::MapSize, "element is 72 bytes");
}

#[test]
fn too_many_entries_is_refused() {
    let r = check_c(
        "huge",
        r#"
struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 4000000);
         __type(key, __u32); __type(value, __u32); } huge SEC(".maps");
SEC("xdp") int prog(struct xdp_md *ctx) {
    __u32 k = 0;
    return bpf_map_lookup_elem(&huge, &k) ? XDP_PASS : XDP_DROP;
}"#,
        "nfp",
    );
    assert_refused(&r, Rule::MapEntries, "4000000 entries");
}

#[test]
fn map_flags_are_refused() {
    let r = check_c(
        "flags",
        r#"
struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 16); __uint(map_flags, BPF_F_NO_PREALLOC);
         __type(key, __u32); __type(value, __u32); } fl SEC(".maps");
SEC("xdp") int prog(struct xdp_md *ctx) {
    __u32 k = 0;
    return bpf_map_lookup_elem(&fl, &k) ? XDP_PASS : XDP_DROP;
}"#,
        "nfp",
    );
    assert_refused(&r, Rule::MapFlags, "flags 0x1");
}

#[test]
fn context_field_read_is_refused() {
    let r = check_c(
        "ctxread",
        r#"SEC("xdp") int prog(struct xdp_md *ctx) { return ctx->ingress_ifindex == 7 ? XDP_DROP : XDP_PASS; }"#,
        "nfp",
    );
    assert_refused(&r, Rule::CtxAccess, "ingress_ifindex (offset 12)");
}

#[test]
fn packet_key_is_refused() {
    let r = check_c(
        "pktkey",
        r#"
struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 16);
         __type(key, __u32); __type(value, __u32); } h SEC(".maps");
SEC("xdp") int prog(struct xdp_md *ctx) {
    void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
    if (data + 4 > end) return XDP_DROP;
    return bpf_map_lookup_elem(&h, data) ? XDP_PASS : XDP_DROP;
}"#,
        "nfp",
    );
    assert_refused(&r, Rule::HelperArg, "key points into the packet");
}

#[test]
fn perf_event_output_needs_current_cpu() {
    let body = |flags: &str| {
        format!(
            r#"
struct {{ __uint(type, BPF_MAP_TYPE_PERF_EVENT_ARRAY); __uint(key_size, 4); __uint(value_size, 4); }} ev SEC(".maps");
SEC("xdp") int prog(struct xdp_md *ctx) {{
    __u64 x = 1;
    bpf_perf_event_output(ctx, &ev, {flags}, &x, sizeof(x));
    return XDP_PASS;
}}"#
        )
    };
    let bad = check_c("perf0", &body("0"), "nfp");
    assert_refused(&bad, Rule::HelperArg, "not BPF_F_CURRENT_CPU");
    // with BPF_F_CURRENT_CPU it is allowed, and the perf array stays on the host
    let good = check_c("perfcur", &body("BPF_F_CURRENT_CPU"), "nfp");
    assert_eq!(
        only(&good).verdict,
        Verdict::LikelyEligible,
        "{}",
        good.human()
    );
}

#[test]
fn legacy_maps_section_is_read() {
    let r = check_c(
        "legacy",
        r#"
struct bpf_map_def_legacy { unsigned int type, key_size, value_size, max_entries, map_flags; };
struct bpf_map_def_legacy lpm SEC("maps") = { BPF_MAP_TYPE_LPM_TRIE, 8, 4, 64, 1 };
SEC("xdp") int prog(struct xdp_md *ctx) {
    __u64 k = 0;
    return bpf_map_lookup_elem(&lpm, &k) ? XDP_PASS : XDP_DROP;
}"#,
        "nfp",
    );
    let m = &r.maps[0];
    assert_eq!((m.name.as_str(), m.origin), ("lpm", MapOrigin::Legacy));
    assert_eq!(
        (m.map_type, m.key_size, m.value_size, m.max_entries),
        (11, 8, 4, 64)
    );
    assert_refused(&r, Rule::MapType, "lpm is lpm_trie");
}

#[test]
fn subprograms_are_functions_of_their_own() {
    let body = r#"
static __attribute__((noinline)) int classify(void *data, void *end) {
    __u8 *p = data;
    if ((void *)(p + 1) > end) return XDP_DROP;
    return p[0] == 0xff ? XDP_DROP : XDP_PASS;
}
SEC("xdp") int prog(struct xdp_md *ctx) {
    return classify((void *)(long)ctx->data, (void *)(long)ctx->data_end);
}"#;
    let r = check_c("subprog", body, "nfp");
    let p = only(&r);
    let names: Vec<&str> = p.functions.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, vec!["prog", "classify"], "{}", r.human());
    assert_ne!(p.verdict, Verdict::Ineligible, "{}", r.human());
    // the hXDP model runs one function only
    let hx = check_c("subprogh", body, "hxdp");
    assert_refused(&hx, Rule::BpfCall, "subprogram");
}

#[test]
fn bad_files_get_one_sentence() {
    let dir = tempfile::tempdir().expect("tempdir");
    let txt = dir.path().join("notes.o");
    std::fs::write(&txt, b"hello, not an object").expect("write");
    let e = check_file(&txt, &Profile::by_name("nfp").expect("nfp")).expect_err("not ELF");
    assert!(matches!(e, Error::NotElf(_)), "{e}");
    assert!(e.to_string().starts_with("not an ELF object"));
    // a host ELF object
    let host = common::compile_str_host("host", "int f(void) { return 1; }", dir.path());
    let e = Object::parse(&std::fs::read(host).expect("read")).expect_err("not BPF");
    assert!(matches!(e, Error::NotBpf(_)), "{e}");
    let missing = check_file(
        &dir.path().join("nope.o"),
        &Profile::by_name("nfp").expect("nfp"),
    )
    .expect_err("missing");
    assert!(matches!(missing, Error::Read(_)));
}

#[test]
fn json_report_has_the_fields() {
    let r = check_c(
        "json",
        r#"SEC("xdp") int prog(struct xdp_md *ctx) { return XDP_REDIRECT; }"#,
        "nfp",
    );
    let v = serde_json::to_value(&r).expect("serialises");
    assert_eq!(v["profile"], "nfp");
    assert_eq!(v["programs"][0]["verdict"], "ineligible");
    assert_eq!(
        v["programs"][0]["functions"][0]["findings"][0]["rule"],
        "return_code"
    );
    assert_eq!(
        v["programs"][0]["functions"][0]["findings"][0]["certainty"],
        "definite"
    );
    assert!(v["programs"][0]["est_target_insns_model"].is_u64());
}
