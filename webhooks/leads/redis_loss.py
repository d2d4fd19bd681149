"""Recovery from a Redis data loss (a restart without its data, a failover to a replica behind):
where each piece lives. Nothing here runs; it is the map a newcomer reads first. The story
and its tests are in docs/leads.md "Recovery".

What is lost, and what puts it back:

1. Cap counters and dedupe keys. Each buyer's `ready` key (keys.ready) goes with them, so
   lua/reserve_lease.lua answers NOT_READY and nothing is sold to that buyer. The first
   reservation refused that way starts a rebuild (caps/rebuild.py `request`, from
   Router.route), which waits one delivery deadline plus SETTLE_MARGIN_S, sets the dedupe
   keys again from the ledger (caps/dedupe.py `restore`) and then the counters
   (Store.rebuild_counters, lua/rebuild_counters.lua), and sets `ready`.
2. Queued settlements. The settlement Redis's epoch key (keys.EPOCH) changes; each web
   process's journal notices (leads/settlement.py `Journal.check_epoch`, every 0.5 s) and
   pushes again what the ledger does not hold yet, so the rebuild counts it.
3. The answers of leads (their claims). `Journal.check_epoch` also puts the journaled answers
   back (Store.restore_answers, lua/restore_answer.lua). For the rest, every claim reads the
   publisher's replay memory mark (keys.lead_memory, in lua/claim_lead.lua, read by
   Store.claim_lead into `LeadClaim.memory_mark`); a missing mark is set to now. While the
   mark is younger than the replay window (storage/claims.py `memory_gap`) a newly claimed
   lead is looked up in the ledger before it is routed (leads/intake.py
   `Intake._settled_answer`).
4. Claims of leads being routed when the data went. For one claim's life after the mark,
   lua/claim_lead.lua answers WAIT (ClaimOutcome.WAIT) for a lead whose claim holds no
   answer, and leads/intake.py `Intake._refuse_after_claim_loss` answers 503 with
   Retry-After, starting every untrusted buyer's rebuild meanwhile
   (`Intake._start_rebuilds`). The request that held the lead writes its answer into the
   empty claim when it ends (lua/answer_lead.lua).
5. A new publisher's mark is "0" from the start (storage/claims.py `remember_from_start`):
   Redis holds every answer it will ever be given, and its leads never read the ledger.
"""
