"""`gpu-rent estimate` prints the calculator's figures per offer: the largest micro-batch,
and with tokens the throughput, the time and the cost to finish with their ranges, the
same figures the API answers."""
import json


def test_estimate_table_carries_the_time_and_cost_to_finish(cli, catalog):  # noqa: F811
    args = ("estimate", "--url", cli.url, "--model", "llama-3.1-8b", "--method", "lora", "--tokens", "100000000")
    code, out, _ = cli(*args, "--json")
    recs = json.loads(out)["recommendations"]
    code, text, _ = cli(*args)
    lines = text.splitlines()
    head = next(line for line in lines if line.startswith("OFFER"))
    assert code == 0 and head.split() == ["OFFER", "GPUS", "MODE", "GB/GPU", "MAX-MICRO-BATCH", "USD/WEEK",
                                          "USD/MONTH", "TOKENS/S", "HOURS", "HOURS-LIKELY", "USD-TO-FINISH",
                                          "USD-LIKELY"]
    first = lines[lines.index(head) + 1].split()
    best = recs[0]
    lo, hi = best["run_hours_range"]
    assert first[0] == best["offer"] and first[4] == str(best["max_micro_batch"])
    assert first[7:] == [str(best["tokens_per_s"]), str(best["run_hours"]), f"{lo}-{hi}",
                         str(best["rental_cost_usd"]), "-".join(str(x) for x in best["rental_cost_range_usd"])]
    code, text, _ = cli("estimate", "--url", cli.url, "--model", "llama-3.1-8b", "--method", "lora")
    head = next(line for line in text.splitlines() if line.startswith("OFFER"))
    assert "TOKENS/S" not in head and "MAX-MICRO-BATCH" in head
