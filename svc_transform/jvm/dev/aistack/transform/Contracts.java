package dev.aistack.transform;

import aistack.v1.Events;
import aistack.v1.Features;
import com.google.protobuf.Descriptors.Descriptor;
import com.google.protobuf.Descriptors.FileDescriptor;
import java.util.HashMap;
import java.util.Map;

/**
 * The aistack.v1 messages the functions write by name, from the Java classes
 * protoc generates from the contracts' descriptor set as the jar is built
 * (svc_transform/jars.py): the same contract the Python services compile.
 */
final class Contracts {
  private static final Map<String, Descriptor> MESSAGES = index(
      Events.getDescriptor(), Features.getDescriptor());

  private Contracts() {}

  static Descriptor message(String fullName) {
    Descriptor found = MESSAGES.get(fullName);
    if (found == null) {
      throw new IllegalArgumentException("no message " + fullName + " in the contracts");
    }
    return found;
  }

  private static Map<String, Descriptor> index(FileDescriptor... files) {
    Map<String, Descriptor> messages = new HashMap<>();
    for (FileDescriptor file : files) {
      for (Descriptor message : file.getMessageTypes()) {
        messages.put(message.getFullName(), message);
      }
    }
    return messages;
  }
}
