// A Curator peer for dlock's ZooKeeper tests and benchmark, compiled with
// javac at test time against Debian's libcurator-recipes-java.
//
//   java CuratorPeer <connect> <path>          commands on stdin, one per line:
//       write <ms> | read <ms>   acquire within ms: prints "held" or "timeout"
//       permit <n> <ms>          one lease of an InterProcessSemaphoreV2 of n
//                                at the path, within ms: "held" or "timeout"
//       revocable-write <ms>     as write, revocable (makeRevocable first)
//       revoked <ms>             waits for the revocable writer to be asked
//                                to let go: prints "revoked" or "timeout"
//       revoke                   Revoker.attemptRevoke on the first node in
//                                line, as Curator's own test does: "sent"
//       release                  releases everything held: prints "released"
//       latch <id>               joins a LeaderLatch at the path with this id
//                                (the rest of the line): prints "started"
//       lead <ms>                waits for the latch to lead: "leader" or "timeout"
//       unlatch                  closes the latch: prints "closed"
//       leader                   the latch path's leader, as any LeaderLatch
//                                reads it: "leader <id>" or "leader none"
//       visits <n> <threads> <each> <stay ms> <log>
//                                threads each take a lease of n `each` times,
//                                stay inside stamping "<id> <unix ns>" lines
//                                to log every few ms: prints "visits <count>"
//       cycles <n>               n uncontended write acquire + release cycles:
//                                prints "cycles <total ns>"
//       permit-cycles <n> <permits>
//                                the same with a lease of a semaphore
//       permit-rate <clients> <permits> <hold ms> <ms>
//                                clients, each its own session, take leases
//                                and hold them for ms: "rate <leases/s>"
//   java CuratorPeer <connect> <path> bench <cycles> <clients>
//       prints "uncontended_ns <mean>" and "handoff_ns <p50>"

import java.io.BufferedReader;
import java.io.FileOutputStream;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Collections;
import java.util.Comparator;
import java.util.Deque;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.leader.Participant;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.framework.recipes.locks.Revoker;
import org.apache.curator.retry.RetryOneTime;

public class CuratorPeer {
    public static void main(String[] args) throws Exception {
        if (args.length > 2 && args[2].equals("bench")) {
            bench(args[0], args[1], Integer.parseInt(args[3]), Integer.parseInt(args[4]));
            return;
        }
        CuratorFramework client = connect(args[0]);
        InterProcessReadWriteLock lock = new InterProcessReadWriteLock(client, args[1]);
        Deque<InterProcessMutex> held = new ArrayDeque<>();
        Deque<Lease> leases = new ArrayDeque<>();
        CountDownLatch[] revoked = {new CountDownLatch(1)};
        LeaderLatch latch = null;
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        System.out.println("ready");
        for (String line; (line = in.readLine()) != null; ) {
            String[] cmd = line.trim().split(" ");
            switch (cmd[0]) {
                case "write":
                case "read":
                    InterProcessMutex m = cmd[0].equals("write") ? lock.writeLock() : lock.readLock();
                    if (m.acquire(Long.parseLong(cmd[1]), TimeUnit.MILLISECONDS)) {
                        held.push(m);
                        System.out.println("held");
                    } else {
                        System.out.println("timeout");
                    }
                    break;
                case "revocable-write": {
                    InterProcessMutex w = lock.writeLock();
                    CountDownLatch asked = new CountDownLatch(1);
                    revoked[0] = asked;
                    w.makeRevocable(unused -> asked.countDown());
                    if (w.acquire(Long.parseLong(cmd[1]), TimeUnit.MILLISECONDS)) {
                        held.push(w);
                        System.out.println("held");
                    } else {
                        System.out.println("timeout");
                    }
                    break;
                }
                case "revoked":
                    boolean asked = revoked[0].await(Long.parseLong(cmd[1]), TimeUnit.MILLISECONDS);
                    System.out.println(asked ? "revoked" : "timeout");
                    break;
                case "revoke": {
                    // Each kind lists only its own nodes; the line goes by sequence.
                    List<String> nodes = new ArrayList<>(lock.readLock().getParticipantNodes());
                    nodes.addAll(lock.writeLock().getParticipantNodes());
                    nodes.sort(Comparator.comparing(node -> node.substring(node.length() - 10)));
                    Revoker.attemptRevoke(client, nodes.get(0));
                    System.out.println("sent");
                    break;
                }
                case "permit": {
                    InterProcessSemaphoreV2 semaphore =
                        new InterProcessSemaphoreV2(client, args[1], Integer.parseInt(cmd[1]));
                    Lease lease = semaphore.acquire(Long.parseLong(cmd[2]), TimeUnit.MILLISECONDS);
                    if (lease != null) {
                        leases.push(lease);
                        System.out.println("held");
                    } else {
                        System.out.println("timeout");
                    }
                    break;
                }
                case "visits":
                    System.out.println("visits " + visits(client, args[1], cmd));
                    break;
                case "release":
                    while (!held.isEmpty()) held.pop().release();
                    while (!leases.isEmpty()) leases.pop().close();
                    System.out.println("released");
                    break;
                case "latch":
                    latch = new LeaderLatch(client, args[1], line.trim().substring("latch ".length()));
                    latch.start();
                    System.out.println("started");
                    break;
                case "lead":
                    boolean leads = latch.await(Long.parseLong(cmd[1]), TimeUnit.MILLISECONDS);
                    System.out.println(leads ? "leader" : "timeout");
                    break;
                case "unlatch":
                    latch.close();
                    latch = null;
                    System.out.println("closed");
                    break;
                case "leader": {
                    Participant leader = new LeaderLatch(client, args[1]).getLeader();
                    System.out.println("leader " + (leader.isLeader() ? leader.getId() : "none"));
                    break;
                }
                case "permit-cycles": {
                    InterProcessSemaphoreV2 semaphore =
                        new InterProcessSemaphoreV2(client, args[1], Integer.parseInt(cmd[2]));
                    int n = Integer.parseInt(cmd[1]);
                    long start = System.nanoTime();
                    for (int i = 0; i < n; i++) semaphore.acquire().close();
                    System.out.println("cycles " + (System.nanoTime() - start));
                    break;
                }
                case "permit-rate":
                    System.out.println("rate " + permitRate(args[0], args[1], cmd));
                    break;
                case "cycles": {
                    InterProcessMutex w = lock.writeLock();
                    int n = Integer.parseInt(cmd[1]);
                    long start = System.nanoTime();
                    for (int i = 0; i < n; i++) { w.acquire(); w.release(); }
                    System.out.println("cycles " + (System.nanoTime() - start));
                    break;
                }
                default:
                    System.out.println("unknown " + cmd[0]);
            }
        }
        client.close();
    }

    static double permitRate(String connect, String path, String[] cmd) throws Exception {
        int clients = Integer.parseInt(cmd[1]);
        int permits = Integer.parseInt(cmd[2]);
        long holdMs = Long.parseLong(cmd[3]);
        long forNs = Long.parseLong(cmd[4]) * 1_000_000L;
        List<CuratorFramework> sessions = new ArrayList<>();
        for (int i = 0; i < clients; i++) sessions.add(connect(connect));
        AtomicLong done = new AtomicLong();
        long start = System.nanoTime();
        long until = start + forNs;
        List<Thread> threads = new ArrayList<>();
        for (CuratorFramework session : sessions) {
            InterProcessSemaphoreV2 semaphore = new InterProcessSemaphoreV2(session, path, permits);
            Thread thread = new Thread(() -> {
                try {
                    while (System.nanoTime() < until) {
                        Lease lease = semaphore.acquire();
                        Thread.sleep(holdMs);
                        lease.close();
                        done.incrementAndGet();
                    }
                } catch (Exception e) {
                    throw new RuntimeException(e);
                }
            });
            thread.start();
            threads.add(thread);
        }
        for (Thread thread : threads) thread.join();
        double rate = done.get() / ((System.nanoTime() - start) / 1e9);
        for (CuratorFramework session : sessions) session.close();
        return rate;
    }

    // Ids above any fence dlock hands out, distinct per process.
    static final AtomicLong NEXT_ID = new AtomicLong(1_000_000_000_000_000L + ProcessHandle.current().pid() * 1_000_000L);

    static int visits(CuratorFramework client, String path, String[] cmd) throws Exception {
        int permits = Integer.parseInt(cmd[1]);
        int threads = Integer.parseInt(cmd[2]);
        int each = Integer.parseInt(cmd[3]);
        long stayMs = Long.parseLong(cmd[4]);
        AtomicInteger count = new AtomicInteger();
        try (FileOutputStream log = new FileOutputStream(cmd[5], true)) {
            List<Thread> started = new ArrayList<>();
            for (int t = 0; t < threads; t++) {
                Thread thread = new Thread(() -> {
                    InterProcessSemaphoreV2 semaphore = new InterProcessSemaphoreV2(client, path, permits);
                    try {
                        for (int i = 0; i < each; i++) {
                            Lease lease = semaphore.acquire();
                            long id = NEXT_ID.getAndIncrement();
                            long until = System.nanoTime() + stayMs * 1_000_000L;
                            do {
                                stamp(log, id);
                                Thread.sleep(5);
                            } while (System.nanoTime() < until);
                            stamp(log, id);
                            lease.close();
                            count.incrementAndGet();
                        }
                    } catch (Exception e) {
                        throw new RuntimeException(e);
                    }
                });
                thread.start();
                started.add(thread);
            }
            for (Thread thread : started) thread.join();
        }
        return count.get();
    }

    // One write per line: appends from several processes stay whole.
    static void stamp(FileOutputStream log, long id) throws Exception {
        Instant now = Instant.now();
        long ns = now.getEpochSecond() * 1_000_000_000L + now.getNano();
        byte[] line = (id + " " + ns + "\n").getBytes(StandardCharsets.US_ASCII);
        synchronized (log) {
            log.write(line);
        }
    }

    static CuratorFramework connect(String connect) throws Exception {
        CuratorFramework client = CuratorFrameworkFactory.newClient(connect, 10000, 5000, new RetryOneTime(100));
        client.start();
        client.blockUntilConnected();
        return client;
    }

    static void bench(String connect, String path, int cycles, int clients) throws Exception {
        CuratorFramework one = connect(connect);
        InterProcessMutex solo = new InterProcessReadWriteLock(one, path + "-solo").writeLock();
        for (int i = 0; i < cycles / 10; i++) { solo.acquire(); solo.release(); } // warm-up
        long start = System.nanoTime();
        for (int i = 0; i < cycles; i++) { solo.acquire(); solo.release(); }
        System.out.println("uncontended_ns " + (System.nanoTime() - start) / cycles);
        one.close();

        // Handoff: from one client's release to the next client's acquire.
        List<CuratorFramework> sessions = new ArrayList<>();
        for (int i = 0; i < clients; i++) sessions.add(connect(connect));
        AtomicLong releasedAt = new AtomicLong();
        List<Long> handoffs = Collections.synchronizedList(new ArrayList<>());
        CountDownLatch done = new CountDownLatch(clients);
        int each = Math.max(1, cycles / clients);
        for (CuratorFramework session : sessions) {
            InterProcessMutex m = new InterProcessReadWriteLock(session, path + "-contended").writeLock();
            new Thread(() -> {
                try {
                    for (int i = 0; i < each; i++) {
                        m.acquire();
                        long released = releasedAt.get();
                        if (released != 0) handoffs.add(System.nanoTime() - released);
                        releasedAt.set(System.nanoTime());
                        m.release();
                    }
                } catch (Exception e) {
                    throw new RuntimeException(e);
                } finally {
                    done.countDown();
                }
            }).start();
        }
        done.await();
        List<Long> sorted = new ArrayList<>(handoffs);
        Collections.sort(sorted);
        System.out.println("handoff_ns " + sorted.get(sorted.size() / 2));
        for (CuratorFramework s : sessions) s.close();
    }
}
