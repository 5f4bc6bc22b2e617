// The requests a local Kafka broker has handled so far, by API, from its own
// metrics (kafka.network:type=RequestMetrics,name=RequestsPerSec: a count per
// request name and version). Run as a single-file program by a JDK (java
// bench/BrokerRequests.java <pid>): it attaches to the broker's JVM (same
// user, same machine), starts its local JMX agent if it is not running, and
// prints one JSON object {"Produce": n, ...}, versions summed. FetchConsumer
// and FetchFollower split Fetch and are left out. Used by bench/broker-requests.ts.
import com.sun.tools.attach.VirtualMachine;
import java.util.Map;
import java.util.TreeMap;
import javax.management.MBeanServerConnection;
import javax.management.ObjectName;
import javax.management.remote.JMXConnector;
import javax.management.remote.JMXConnectorFactory;
import javax.management.remote.JMXServiceURL;

public class BrokerRequests {
  public static void main(String[] args) throws Exception {
    VirtualMachine vm = VirtualMachine.attach(args[0]);
    try (JMXConnector connector = JMXConnectorFactory.connect(new JMXServiceURL(vm.startLocalManagementAgent()))) {
      MBeanServerConnection server = connector.getMBeanServerConnection();
      Map<String, Long> counts = new TreeMap<>();
      ObjectName pattern = new ObjectName("kafka.network:type=RequestMetrics,name=RequestsPerSec,*");
      for (ObjectName name : server.queryNames(pattern, null)) {
        String request = name.getKeyProperty("request");
        if (request == null || request.equals("FetchConsumer") || request.equals("FetchFollower")) continue;
        long count = ((Number) server.getAttribute(name, "Count")).longValue();
        counts.merge(request, count, Long::sum);
      }
      StringBuilder out = new StringBuilder("{");
      for (Map.Entry<String, Long> e : counts.entrySet()) {
        if (out.length() > 1) out.append(',');
        out.append('"').append(e.getKey()).append("\":").append(e.getValue());
      }
      System.out.println(out.append('}'));
    } finally {
      vm.detach();
    }
  }
}
