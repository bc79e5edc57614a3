"""Differential snapshot cases: random registries through the seed's own
snapshot_instance_fleet. Usage: snapshot_cases.py SEED_DIR OUT.json RANDOM_SEED COUNT
(the seed is imported from SEED_DIR, never copied here)."""
import json, os, random, sys
from datetime import datetime, timezone
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, sys.argv[1])
import mcp_fleet_snapshot as f
random.seed(int(sys.argv[3])); n=int(sys.argv[4])
def pick(*xs): return random.choice(xs)
cases=[]
for c in range(n):
    rows=[]
    alive={}
    for i in range(random.randint(1,8)):
        pid=pick(100+i,100+i,101,None,"102")
        row={"worker_identity": pick(f"w{i}",f"w{i}","w0"),"client_name":pick("codex","codex","gemini","vim",None),
             "client_instance_id":pick("inst-a","inst-a","inst-b","legacy-1","",None," inst-a"),
             "instance_id_source":pick("launcher",None,"pid_fallback"),
             "session_id":pick(f"s{i}","sA","sA",None,""),"generation_id":pick(f"g{i}","gA",None),
             "namespace":pick("author","reviewer","merger","author",None),"repository_binding":pick("o/r","o/r","x/y",None),
             "pid":pid,"process_identity":pick(None,None,"p1"),"fencing_epoch":pick(1,2,None),
             "last_heartbeat_at":pick("2026-07-30T11:59:00Z","2026-07-30T11:59:00Z","2026-07-30T10:00:00Z","bad"),
             "heartbeat_ttl_seconds":900,"status":pick("active","active","active","released","retired"),
             "loaded_revision":pick("r1","r1","r0",None)}
        rows.append(row)
    probe_alive={100+i:pick(True,True,False,None) for i in range(8)}
    def probe(p):
        if isinstance(p,bool) or not isinstance(p,int) or p<=0: return None
        return probe_alive.get(p, False)
    manifest=pick(None,[{"client_instance_id":"inst-a"}],[{"client_instance_id":"inst-a"},{"client_instance_id":"inst-c"}])
    snap=f.snapshot_instance_fleet(rows, expected_manifest=manifest, now=datetime(2026,7,30,12,0,0,tzinfo=timezone.utc),
        pid_alive_probe=probe, canonical_repository="o/r", expected_live_revision="r1")
    cases.append({"rows":rows,"alive":{str(k):v for k,v in probe_alive.items()},"manifest":manifest,
        "findings":sorted([ (x["classification"], sorted(str(w) for w in x["worker_identities"]), sorted(x["client_instance_ids"])) for x in snap["findings"]]),
        "live":snap["live_worker_count"],"stale":snap["stale_worker_count"],"hist":snap["historical_worker_count"],
        "token":snap["consistency_token"]})
json.dump(cases, open(sys.argv[2],"w"))
