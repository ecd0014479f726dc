#!/bin/sh
# kafka-server-start.sh of the segscope Kafka image: the broker, logging to stdout (the kubelet
# keeps the container log); LOG_DIR only holds the GC and state-change files Kafka writes there
exec java ${KAFKA_HEAP_OPTS:--Xmx1g} -XX:+UseG1GC -Djava.awt.headless=true \
    -Dkafka.logs.dir="${LOG_DIR:-/tmp/kafka-logs}" \
    -Dlog4j2.configurationFile=/opt/kafka/config/log4j2.properties \
    -cp '/opt/kafka/libs/*' kafka.Kafka "$@"
