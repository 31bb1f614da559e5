"""Bench and autotune: prove the speed-up side by side, tune it from measured acceptance.

    workloads  shipped prompts over the project's own source (code, edit, chat), fixed output lengths
    runner     one llama-server per configuration, interleaved requests (A B A B)
    measure    pure: samples -> rows (median, spread, paired ratios, acceptance, accept length), projection
    report     terminal table, PNG chart
    tune       successive halving over speculators and parameters; the choice (pure); profiles
    profiles   the profile store under the XDG state dir
    service    run_bench(): what `bostudio bench` runs

`bostudio bench MODEL --json` prints one JSON object (see measure.report_json) on stdout, progress on stderr.
Nothing is imported here, so that `bostudio.up` can read profiles without loading the runner.
"""
