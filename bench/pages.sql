-- bench/pages.py's ledger: a month of leads and what the console and portal pages read beside
-- them. `{name}` is a lead's attribute of [expr] or a figure of the run (pages.py load()).
-- [expr] a lead's attributes from its number `seq` (every table's rows made from it, none read back)
p: CONCAT('pub-', MOD(seq, 20))
l: CONCAT('lead-', seq)
b: CONCAT('buyer-', MOD(seq, 17))
st: CASE WHEN MOD(seq DIV 20, 10) < 6 THEN 'sold' WHEN MOD(seq DIV 20, 10) < 9 THEN 'unsold' ELSE 'returned' END
sold: (MOD(seq DIV 20, 10) < 6 OR MOD(seq DIV 20, 10) = 9)
ret: (MOD(seq DIV 20, 10) = 9)
pending: (MOD(seq DIV 20, 10) = 9 AND MOD(seq DIV 200, 400) = 0)
hold: (MOD(MOD(seq, 20), 4) = 0)
price: (5 + MOD(seq, 20))
pay: (0.50 + MOD(seq, 20) / 10)
-- [leads] for each chunk of leads, seq_{first}_to_{last} (MariaDB's sequence engine)
INSERT INTO leads (publisher_id, lead_id, status, buyer_id, price, commission, payload,
  received_at, sold_at, settled_at, returned_at, return_reason)
  SELECT {p}, {l}, {st}, IF({sold}, {b}, NULL), IF({sold}, {price}, NULL), IF({sold}, {pay}, NULL),
  CONCAT('{{"email": "c', seq, '@example.com", "phone": "+1555', LPAD(MOD(seq, 10000000), 7, '0'),
  '", "state": "TX", "zip": "73301"}}'),
  {at}, IF({sold}, {at}, NULL), {at}, IF({ret}, {at} + INTERVAL 1 HOUR, NULL), IF({ret}, 'wrong number', NULL)
  FROM seq_{first}_to_{last};
INSERT INTO lead_attempts (publisher_id, lead_id, seq, buyer_id, outcome, ms)
  SELECT {p}, {l}, 0, {b}, CASE WHEN MOD(seq, 100000) = 1 THEN 'unknown'
  WHEN {sold} THEN 'accepted' ELSE 'rejected' END, 120 FROM seq_{first}_to_{last};
INSERT INTO sales (publisher_id, lead_id, buyer_id, price, payout, status, sold_at, returned_at,
  return_reason, payout_state, payable_at)
  SELECT {p}, {l}, {b}, {price}, {pay}, IF({pending}, 'return_pending', IF({ret}, 'returned', 'sold')), {at},
  IF({ret} AND NOT {pending}, {at} + INTERVAL 1 HOUR, NULL), IF({ret}, 'wrong number', NULL),
  CASE WHEN {hold} AND {ret} AND NOT {pending} THEN 'cancelled'
  WHEN {hold} AND {at} > '{held_since}' THEN 'held' ELSE 'payable' END,
  {at} + INTERVAL IF({hold}, 3, 0) DAY FROM seq_{first}_to_{last} WHERE {sold};
INSERT INTO lead_stats (hour, publisher_id, buyer_id, leads, sold, returned, revenue, payout,
  sales, offers, accepted)
  SELECT DATE_FORMAT({at}, '%Y-%m-%d %H:00:00'), {p}, IF({sold}, {b}, ''), COUNT(*), SUM({sold}), SUM({ret}),
  SUM(IF({sold} AND NOT {ret}, {price}, 0)), SUM(IF({sold} AND NOT {ret}, {pay}, 0)), SUM({sold}), COUNT(*),
  SUM({sold}) FROM seq_{first}_to_{last} GROUP BY 1, 2, 3
  ON DUPLICATE KEY UPDATE leads = leads + VALUES(leads), sold = sold + VALUES(sold),
  returned = returned + VALUES(returned), revenue = revenue + VALUES(revenue),
  payout = payout + VALUES(payout), sales = sales + VALUES(sales), offers = offers + VALUES(offers),
  accepted = accepted + VALUES(accepted);
-- [sales] for each range of the sales' ids, made from the sales
INSERT INTO wallet_entries (customer, currency, kind, amount_minor, reference, at)
  SELECT CONCAT(buyer_id, '@example.com'), 'USD', 'sale', -100 * price, CONCAT('sale:', id), sold_at
  FROM sales WHERE id BETWEEN {first} AND {last}
  UNION ALL SELECT CONCAT(buyer_id, '@example.com'), 'USD', 'return', 100 * price, CONCAT('return:', id),
  returned_at FROM sales WHERE id BETWEEN {first} AND {last} AND status = 'returned';
INSERT INTO lead_returns (return_id, sale_id, publisher_id, lead_id, buyer_id, reason, status,
  requested_at, decided_at, actor)
  SELECT CONCAT('ret', id), id, publisher_id, lead_id, buyer_id, 'wrong number',
  IF(status = 'returned', 'approved', 'pending'), sold_at + INTERVAL 1 HOUR, returned_at,
  IF(status = 'returned', CONCAT('buyer:', buyer_id), NULL)
  FROM sales WHERE id BETWEEN {first} AND {last} AND status IN ('returned', 'return_pending');
INSERT INTO audit_log (at, actor, action, entity, entity_id, detail)
  SELECT returned_at, CONCAT('buyer:', buyer_id), 'lead.returned', 'lead', CONCAT(publisher_id, ':', lead_id),
  CONCAT('{{"buyer_id": "', buyer_id, '", "reason": "wrong number"}}')
  FROM sales WHERE id BETWEEN {first} AND {last} AND status = 'returned';
INSERT INTO feedback (buyer_id, feedback_id, sale_id, publisher_id, lead_id, event, created_at)
  SELECT buyer_id, CONCAT('fb', id), id, publisher_id, lead_id, IF(MOD(id, 60) = 0, 'converted', 'contacted'),
  sold_at + INTERVAL 2 HOUR FROM sales WHERE id BETWEEN {first} AND {last} AND MOD(id, 20) = 0;
INSERT INTO events (event_id, type, subject, entity, publisher_id, body, created_at, fanned_out)
  SELECT CONCAT('evt_', id), 'lead.sold', CONCAT(publisher_id, ':', lead_id, ':', buyer_id),
  CONCAT('lead:', publisher_id, ':', lead_id), publisher_id, CONCAT('{{"type": "lead.sold", "data": {{"lead_id": "',
  lead_id, '"}}}}'), sold_at, 1
  FROM sales WHERE id BETWEEN {first} AND {last} AND publisher_id = 'pub-7';
-- [once] at the end
INSERT INTO event_dispatches (event_id, endpoint_id, entity, webhook_id, status, attempts, created_at,
  next_attempt_at, delivered_at)
  SELECT id, 'pub-7-hook', entity, CONCAT('msg_', id), IF(MOD(id, 5000) = 0, 'failed', 'delivered'), 1,
  created_at, created_at, created_at FROM events;
INSERT INTO wallet_entries (customer, currency, kind, amount_minor, reference, at)
  SELECT CONCAT('buyer-', MOD(seq, 17), '@example.com'), 'USD', 'top_up', 500000000, CONCAT('paystack:top-', seq),
  '{start}' + INTERVAL (seq DIV 17) DAY FROM seq_0_to_{topups};
INSERT INTO payments (provider, reference, amount_minor, currency, customer, status, event_type, received_at,
  credited_at)
  SELECT 'paystack', CONCAT('top-', seq), IF(seq <= {topups}, 500000000, 1000 * MOD(seq, 97)), 'USD',
  IF(seq <= {topups}, CONCAT('buyer-', MOD(seq, 17), '@example.com'), CONCAT('payer', seq, '@example.com')),
  IF(MOD(seq, 400) = 7 AND seq > {topups}, 'unattributed', 'credited'), 'charge.success',
  '{start}' + INTERVAL (seq * {payment_s}) SECOND, '{start}' + INTERVAL (seq * {payment_s}) SECOND
  FROM seq_0_to_{payments};
INSERT INTO wallets (customer, currency, balance_minor, updated_at, version)
  SELECT customer, currency, SUM(amount_minor), NOW(6), 1 FROM wallet_entries GROUP BY customer, currency
  ON DUPLICATE KEY UPDATE balance_minor = VALUES(balance_minor);
INSERT INTO lead_stats_days (day, publisher_id, buyer_id, leads, sold, returned, revenue, payout, sales, offers,
  accepted, conversions)
  SELECT DATE(hour), publisher_id, buyer_id, SUM(leads), SUM(sold), SUM(returned), SUM(revenue), SUM(payout),
  SUM(sales), SUM(offers), SUM(accepted), SUM(conversions) FROM lead_stats GROUP BY 1, 2, 3;
